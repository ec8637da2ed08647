// touch_pages.c — what the first write to fresh anonymous memory costs per 4 KiB page, and
// whether the guest's free page reporting makes it dearer (docs/cache.md, "Costs and
// limits"). Maps MiB of anonymous memory (no huge pages), writes one byte per page, unmaps,
// sleeps GAP_S seconds, four times. Pages the guest frees are reported to the hypervisor
// (virtio-balloon free page reporting, /sys/module/page_reporting/parameters/
// page_reporting_order) once they sit in a free block of that order; the host then drops
// them, and the next first touch waits for the host to back them again.
// Build and run: cc -O2 -o /tmp/touch_pages bench/micro/touch_pages.c
//                /tmp/touch_pages MIB GAP_S          (e.g. 2048 10)
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static double touch(size_t n){
  char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(p,n,MADV_NOHUGEPAGE);
  double t=now(); for(size_t i=0;i<n;i+=4096)p[i]=1; t=now()-t;
  munmap(p,n); return t/(n/4096)*1e6;}
int main(int c,char**v){
  if(c!=3||atoi(v[1])<=0||atoi(v[2])<0){fprintf(stderr,"usage: %s MIB GAP_S\n",v[0]);return 64;}
  size_t n=(size_t)atoi(v[1])<<20; int gap=atoi(v[2]);
  for(int i=0;i<4;i++){printf("pass %d: %.2f us/page\n",i,touch(n)); fflush(stdout); sleep(gap);} }
