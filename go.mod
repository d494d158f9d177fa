module github.com/hydra-engine/hydra-engine

go 1.26
