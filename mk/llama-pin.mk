# The llama.cpp tree the llama plugin builds against, on one line: the npm
# package that ships it as a git bundle (llama/gitRelease.bundle), npm's
# integrity of that package's tarball, and the tree's commit in the bundle.
# Moving to another llama.cpp is this line and `make test`; the fetch
# (plugins/cuda-llama/fetch-llama.sh) checks both hashes, and a test checks the
# commit the plugin was built from against this line.
LLAMA_PIN := node-llama-cpp@3.21.1 sha512-E3N0Ev2Va0wzydvXYFwM9Hvyo07PoWjt8T/9GMc43Cvt8YkV/NU/tYUgEMC1grTPv2o9PRjQi0G3Wb5P/awiMg== 80fb11ac73e66d89eae2c6a91d8a77428fa733ed
