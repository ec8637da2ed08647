// remap_slice.c — what it costs to hand one expert slice's pool chunk from an evicted
// expert's address to a new one (docs/cache.md, "Moved pages"). A memfd pool of 1000 chunks
// of 206 pages mapped into a 2048-slot PROT_NONE reservation (about the 30B preset's slice
// size), then ITERS times: take the oldest slot's chunk to a free slot and write one byte
// per page (the read that would fill it).
//   mode 0: unmap (PROT_NONE reservation) + madvise + mmap(MAP_POPULATE) at the new slot:
//           the cache with `--cache-no-move`
//   mode 1: mode 0 without the madvise
//   mode 2: mremap to the new slot (a hole is left) + PROT_NONE into the hole
//   mode 3: mremap(MREMAP_DONTUNMAP) + PROT_NONE over the old range + madvise: the cache's default
// SPINNER = 1 runs a second thread spinning on another CPU, as ggml's OpenMP threads do while
// the router callback stages: every TLB shootdown then interrupts it.
// Build and run: cc -O2 -o /tmp/remap_slice bench/micro/remap_slice.c -lpthread
//                /tmp/remap_slice MODE SPINNER ITERS      (e.g. 3 1 3000)
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now() {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
#define PG 4096UL
#define SP 206UL  /* pages per slice */
#define NS 2048UL /* slots in reservation (~1.6 GiB) */
#define NC 1000UL /* chunks (live) */
static atomic_int stop;
static void * spin(void * a) {
    volatile unsigned long x = 0;
    while (!atomic_load(&stop)) x++;
    return 0;
}
int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODE(0-3) SPINNER(0|1) ITERS\n", argv[0]);
        return 64;
    }
    int mode = atoi(argv[1]);
    int spinner = atoi(argv[2]);
    int iters = atoi(argv[3]);
    int fd = memfd_create("pool", 0);
    ftruncate(fd, NC * SP * PG);
    char * base =
        mmap(0, NS * SP * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    int * chunk_of = malloc(NS * sizeof(int));
    for (size_t i = 0; i < NS; i++) chunk_of[i] = -1;
    /* fill: slot i <- chunk i, odd slots only so VMAs fragment */
    size_t live[NC];
    size_t nl = 0;
    for (size_t c = 0; c < NC; c++) {
        size_t s = (c * 2 + 1) % NS;
        mmap(base + s * SP * PG, SP * PG, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd, c * SP * PG);
        chunk_of[s] = c;
        live[nl++] = s;
        memset(base + s * SP * PG, 1, SP * PG);
    }
    pthread_t th;
    if (spinner) pthread_create(&th, 0, spin, 0);
    srand(1);
    double t = now();
    size_t head = 0;
    for (int it = 0; it < iters; it++) {
        size_t victim = live[head]; /* FIFO as LRU stand-in */
        size_t tgt;
        do {
            tgt = rand() % NS;
        } while (chunk_of[tgt] >= 0);
        int c = chunk_of[victim];
        char *va = base + victim * SP * PG, *ta = base + tgt * SP * PG;
        if (mode == 0) { /* current: evict PROT_NONE + madvise + map populate */
            mmap(va, SP * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
            madvise(va, SP * PG, MADV_NOHUGEPAGE);
            mmap(ta, SP * PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd,
                 (off_t)c * SP * PG);
        } else if (mode == 1) { /* no madvise */
            mmap(va, SP * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
            mmap(ta, SP * PG, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE, fd,
                 (off_t)c * SP * PG);
        } else if (mode == 3) {
            void * r =
                mremap(va, SP * PG, SP * PG, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, ta);
            if (r == MAP_FAILED) {
                perror("mremap");
                return 1;
            }
            mmap(va, SP * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
            madvise(va, SP * PG, MADV_NOHUGEPAGE);
        } else { /* mremap move + refill hole */
            void * r = mremap(va, SP * PG, SP * PG, MREMAP_MAYMOVE | MREMAP_FIXED, ta);
            if (r == MAP_FAILED) {
                perror("mremap");
                return 1;
            }
            mmap(va, SP * PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                 -1, 0);
        }
        chunk_of[tgt] = c;
        chunk_of[victim] = -1;
        live[head] = tgt;
        head = (head + 1) % nl;
        /* write the slice like a read would */
        for (size_t p = 0; p < SP; p += 1) ta[p * PG] = 2;
    }
    t = now() - t;
    atomic_store(&stop, 1);
    if (spinner) pthread_join(th, 0);
    /* count vmas */
    FILE * f = fopen("/proc/self/maps", "r");
    int n = 0;
    char l[512];
    while (fgets(l, 512, f)) n++;
    fclose(f);
    printf("mode %d spinner %d: %.1f us/slice, %d maps\n", mode, spinner, t / iters * 1e6, n);
}
