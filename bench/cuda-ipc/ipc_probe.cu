// ipc_probe: can a head engine run its expert matmuls on weights that another
// process (a peer engine) holds on the GPU, through CUDA IPC, instead of a
// copy of its own? Issue 29's go/no-go, measured without ggml: the child
// (the "peer") allocates SIZE bytes with cudaMalloc as ggml-cuda allocates a
// weights buffer, fills them and exports the allocation; the parent (the
// "head") imports it and compares, on the same GPU, reading the imported
// bytes with reading a cudaMalloc of its own (a GEMV-like pass: every byte
// read once, as a decode step reads the weights), and the time to open the
// handle with the time to upload the same bytes from pinned host memory.
// Then the peer exits, as an engine restarts, and the head reads again: what
// the head sees then decides whether it could keep such a mapping.
//
//   nvcc -O2 -arch=sm_90 -o ipc_probe ipc_probe.cu && ./ipc_probe [GiB]
//
// One line per measurement on stdout; exit status 0 when every step ran.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                           \
        }                                                                                      \
    } while (0)

static double now() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__global__ void fill(unsigned * p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        p[i] = (unsigned) i * 2654435761u ^ seed;
    }
}

// sum reads every word once (coalesced, 16 bytes a load) and adds them up.
__global__ void sum(const uint4 * p, size_t n, unsigned long long * out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        uint4 v = p[i];
        s += (unsigned long long) v.x + v.y + v.z + v.w;
    }
    atomicAdd(out, s);
}

// readPass is the best of reps passes over n bytes at p, in GB/s, and their sum.
static double readPass(const void * p, size_t n, int reps, unsigned long long * total) {
    unsigned long long * d;
    CK(cudaMalloc(&d, sizeof *d));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < reps; r++) {
        CK(cudaMemset(d, 0, sizeof *d));
        CK(cudaEventRecord(a));
        sum<<<1320, 512>>>((const uint4 *) p, n / sizeof(uint4), d);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaGetLastError());
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (ms < best) {
            best = ms;
        }
    }
    CK(cudaMemcpy(total, d, sizeof *total, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    return n / (best * 1e-3) / 1e9;
}

static void writeAll(int fd, const void * p, size_t n) {
    if (write(fd, p, n) != (ssize_t) n) {
        perror("write");
        exit(2);
    }
}

static void readAll(int fd, void * p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *) p + got, n - got);
        if (k <= 0) {
            fprintf(stderr, "read: the other side went away\n");
            exit(2);
        }
        got += k;
    }
}

// peer: allocate, fill, export, wait for the word to go, then exit (freeing).
static int peer(size_t n, int toHead, int fromHead) {
    CK(cudaSetDevice(0));
    void * p;
    double t = now();
    CK(cudaMalloc(&p, n));
    fill<<<1320, 512>>>((unsigned *) p, n / 4, 7);
    CK(cudaDeviceSynchronize());
    cudaIpcMemHandle_t h;
    double t1 = now();
    CK(cudaIpcGetMemHandle(&h, p));
    printf("peer: cudaMalloc+fill %.1f ms, cudaIpcGetMemHandle %.3f ms\n", (t1 - t) * 1e3, (now() - t1) * 1e3);
    fflush(stdout);
    writeAll(toHead, &h, sizeof h);
    char c;
    readAll(fromHead, &c, 1); // the head is done with the first round
    CK(cudaFree(p));
    printf("peer: freed the exported allocation and exits (as a restarting engine)\n");
    fflush(stdout);
    return 0;
}

int main(int argc, char ** argv) {
    double gib = argc > 1 ? atof(argv[1]) : 4;
    size_t n = (size_t) (gib * (1ull << 30)) / 64 * 64;
    int up[2], down[2];
    if (pipe(up) || pipe(down)) {
        perror("pipe");
        return 2;
    }
    pid_t pid = fork(); // before any CUDA call: a context does not survive fork
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        return peer(n, up[1], down[0]);
    }
    close(up[1]);
    close(down[0]);
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %.2f GiB exported by the peer\n", prop.name, n / (double) (1ull << 30));

    cudaIpcMemHandle_t h;
    readAll(up[0], &h, sizeof h);
    void * ipc;
    double t = now();
    CK(cudaIpcOpenMemHandle(&ipc, h, cudaIpcMemLazyEnablePeerAccess));
    double openMs = (now() - t) * 1e3;

    // The head's own copy of the same bytes, uploaded from pinned host memory
    // as a swap or combined mode uploads a donor's weights.
    void * own, * host;
    CK(cudaMalloc(&own, n));
    CK(cudaMallocHost(&host, n));
    CK(cudaMemcpy(host, ipc, n, cudaMemcpyDeviceToHost));
    t = now();
    CK(cudaMemcpy(own, host, n, cudaMemcpyHostToDevice));
    double uploadMs = (now() - t) * 1e3;
    printf("head: cudaIpcOpenMemHandle %.3f ms; its own copy: host->GPU upload %.1f ms (%.1f GB/s)\n", openMs,
           uploadMs, n / (uploadMs * 1e-3) / 1e9);

    unsigned long long sIPC, sOwn;
    double gIPC = readPass(ipc, n, 10, &sIPC);
    double gOwn = readPass(own, n, 10, &sOwn);
    printf("head: read pass over the peer's bytes %.0f GB/s, over its own copy %.0f GB/s (ratio %.3f), sums %s\n",
           gIPC, gOwn, gIPC / gOwn, sIPC == sOwn ? "equal" : "DIFFER");
    size_t freeB, totalB;
    CK(cudaMemGetInfo(&freeB, &totalB));
    printf("head: device memory used %.2f GiB with the mapping and its own copy\n",
           (totalB - freeB) / (double) (1ull << 30));

    // The peer exits while the mapping is open.
    char c = 1;
    writeAll(down[1], &c, 1);
    int st;
    waitpid(pid, &st, 0);
    CK(cudaMemGetInfo(&freeB, &totalB));
    printf("head: peer exited (status %d); device memory used %.2f GiB: the mapping %s\n", WEXITSTATUS(st),
           (totalB - freeB) / (double) (1ull << 30),
           "keeps the peer's allocation alive until the head closes it, or not (compare with the line above)");
    unsigned long long after;
    unsigned long long * d;
    CK(cudaMalloc(&d, sizeof *d));
    CK(cudaMemset(d, 0, sizeof *d));
    sum<<<1320, 512>>>((const uint4 *) ipc, n / sizeof(uint4), d);
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) {
        CK(cudaMemcpy(&after, d, sizeof after, cudaMemcpyDeviceToHost));
        printf("head: read after the peer exited: ok, sum %s\n", after == sIPC ? "unchanged" : "CHANGED");
    } else {
        printf("head: read after the peer exited: %s (the context is lost)\n", cudaGetErrorString(e));
        return 0;
    }
    t = now();
    CK(cudaIpcCloseMemHandle(ipc));
    CK(cudaMemGetInfo(&freeB, &totalB));
    printf("head: cudaIpcCloseMemHandle %.3f ms; device memory used %.2f GiB after\n", (now() - t) * 1e3,
           (totalB - freeB) / (double) (1ull << 30));
    return 0;
}
