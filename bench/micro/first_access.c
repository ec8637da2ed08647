// first_access.c — what the first CPU access to a page costs right after its page-table entry
// was made or changed, with the page itself already in memory (docs/cache.md, "Costs and
// limits"). The expert cache makes such entries for every slice it commits: it maps a pool
// chunk at the expert's address, moves one there (mremap) or unprotects it. Where the
// hypervisor keeps shadow page tables (nested virtualization) each new entry costs an exit at
// its first access, whichever thread makes it; on bare metal it costs a TLB fill.
// Fills a memfd of MIB MiB, then reads one byte per 4 KiB page twice after each of:
//   a second mapping of the same pages (MAP_POPULATE), a move of that mapping (mremap), and
//   mprotect(PROT_NONE) then back to read-write; and once more from another thread right
//   after a new mapping, then from this one. Prints seconds per pass and µs per page.
// Build and run: cc -O2 -o /tmp/first_access bench/micro/first_access.c -lpthread
//                /tmp/first_access MIB            (e.g. 1024)
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static size_t n_bytes;
static volatile unsigned long sink;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double pass(const unsigned char * p) {
    const double t = now();
    unsigned long s = 0;
    for (size_t i = 0; i < n_bytes; i += 4096) s += p[i];
    sink = s;
    return now() - t;
}

static void report(const char * what, double first, double second) {
    const double pages = (double)(n_bytes / 4096);
    printf("%-34s first %.3f s (%.2f us/page)  second %.3f s (%.2f us/page)\n", what, first,
           first / pages * 1e6, second, second / pages * 1e6);
}

static void * other(void * p) {
    double * t = malloc(sizeof(double));
    *t = pass((const unsigned char *)p);
    return t;
}

int main(int argc, char ** argv) {
    if (argc != 2 || atol(argv[1]) <= 0) {
        fprintf(stderr, "usage: %s MIB\n", argv[0]);
        return 64;
    }
    n_bytes = (size_t)atol(argv[1]) << 20;
    const int fd = memfd_create("first_access", 0);
    if (fd < 0 || ftruncate(fd, (off_t)n_bytes) != 0) {
        perror("memfd");
        return 1;
    }
    unsigned char * orig = mmap(0, n_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (orig == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(orig, 1, n_bytes);
    double a = pass(orig), b = pass(orig);
    report("the mapping that wrote the pages", a, b);

    unsigned char * q = mmap(0, n_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    a = pass(q), b = pass(q);
    report("a second mapping (MAP_POPULATE)", a, b);

    unsigned char * dst = mmap(0, n_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    q = mremap(q, n_bytes, n_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
    if (q == MAP_FAILED) {
        perror("mremap");
        return 1;
    }
    a = pass(q), b = pass(q);
    report("that mapping moved (mremap)", a, b);

    mprotect(q, n_bytes, PROT_NONE);
    mprotect(q, n_bytes, PROT_READ | PROT_WRITE);
    a = pass(q), b = pass(q);
    report("PROT_NONE, then read-write again", a, b);

    unsigned char * r = mmap(0, n_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    pthread_t t;
    void * res = NULL;
    pthread_create(&t, NULL, other, r);
    pthread_join(t, &res);
    a = *(double *)res;
    free(res);
    b = pass(r);
    report("new mapping: other thread, then us", a, b);
    return 0;
}
