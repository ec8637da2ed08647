// fallback_convert.cpp — what --miss-fallback's conversion costs (docs/quality.md, "Low-bit
// fallback"): one 30B-shaped expert (gate and up 2048 x 768, down 768 x 2048) dequantized from
// a low-bit type with ggml's to_float and re-quantized into the bank's type, both with
// ggml_quantize_chunk (ggml-base's reference quantizer, what the engine uses) and with the CPU
// backend's from_float (ggml_get_type_traits_cpu of the .so given), on 1 and 2 threads; next
// to reading the full expert at 2.5 GB/s, and the read rate at which the conversion pays.
// Build against the private prefix and run (the backend the engine loads: `moestream --version`):
//   L=.deps/prefix/usr/lib/x86_64-linux-gnu
//   g++ -O2 -std=c++20 bench/micro/fallback_convert.cpp -I.deps/prefix/usr/include -L$L \
//       -lggml-base -ldl -pthread -o /tmp/fallback_convert -Wl,--no-as-needed \
//       -Wl,--allow-shlib-undefined -Wl,-rpath,$L -Wl,--dynamic-linker=$(ls $L/ld-linux*)
//   /tmp/fallback_convert $L/ggml/backends0/libggml-cpu-sapphirerapids.so
#include <dlfcn.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <random>
#include "ggml.h"
#include "ggml-cpu.h"
typedef const ggml_type_traits_cpu * (*get_cpu_t)(enum ggml_type);
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
int main(int argc, char**argv){
  const char* lib = argc>1?argv[1]:nullptr;
  void* h = dlopen(lib, RTLD_NOW|RTLD_LOCAL);
  if(!h){fprintf(stderr,"dlopen %s\n",dlerror());return 1;}
  auto gc=(get_cpu_t)dlsym(h,"ggml_get_type_traits_cpu");
  // one expert: 3 projections of 2048*768 elements (row length 2048 for gate/up, 768 for down)
  const int64_t rows_gu=768, n_gu=2048, rows_d=2048, n_d=768;
  const int64_t nel = 3*2048*768;
  std::vector<float> src(nel); std::mt19937 rng(1); std::normal_distribution<float> nd(0,0.02f);
  for(auto&x:src)x=nd(rng);
  struct P{ggml_type lo, hi;};
  P pairs[]={{GGML_TYPE_Q2_K,GGML_TYPE_Q4_K},{GGML_TYPE_Q3_K,GGML_TYPE_Q4_K},{GGML_TYPE_IQ2_XS,GGML_TYPE_Q4_K},{GGML_TYPE_IQ3_S,GGML_TYPE_Q4_K},{GGML_TYPE_Q4_0,GGML_TYPE_Q8_0},{GGML_TYPE_Q2_K,GGML_TYPE_Q6_K},{GGML_TYPE_Q4_K,GGML_TYPE_Q8_0},{GGML_TYPE_Q2_K,GGML_TYPE_Q8_0}};
  for(int nth : {1,2}){
  for(auto p:pairs){
    auto tl=ggml_get_type_traits(p.lo), th=ggml_get_type_traits(p.hi);
    // IQ types need quant init (imatrix-free quantization only allowed for some); use ggml_quantize_init
    ggml_quantize_init(p.lo); ggml_quantize_init(p.hi);
    size_t lo_bytes = ggml_row_size(p.lo,n_gu)*rows_gu*2 + ggml_row_size(p.lo,n_d)*rows_d;
    size_t hi_bytes = ggml_row_size(p.hi,n_gu)*rows_gu*2 + ggml_row_size(p.hi,n_d)*rows_d;
    std::vector<uint8_t> lo(lo_bytes), hi(hi_bytes); std::vector<float> tmp(nel);
    // make the low-bit copy (not timed). IQ2 needs an imatrix: pass ones.
    std::vector<float> imat(2048,1.0f);
    size_t off=0;
    off+=ggml_quantize_chunk(p.lo,src.data(),lo.data(),0,rows_gu*2,n_gu,ggml_quantize_requires_imatrix(p.lo)?imat.data():nullptr);
    ggml_quantize_chunk(p.lo,src.data()+rows_gu*2*n_gu,lo.data()+off,0,rows_d,n_d,ggml_quantize_requires_imatrix(p.lo)?imat.data():nullptr);
    auto cpu_hi = gc? gc(p.hi):nullptr;
    double best_deq=1e9,best_ref=1e9,best_cpu=1e9;
    for(int it=0;it<3;++it){
      auto work=[&](int part, int mode){ // mode 0 deq only, 1 deq+ref quant, 2 deq+cpu from_float
        // split by rows across threads: rows of gate/up (1536 rows of 2048) then down (2048 rows of 768)
        size_t lrs=ggml_row_size(p.lo,n_gu), hrs=ggml_row_size(p.hi,n_gu);
        int64_t r0=rows_gu*2*part/nth, r1=rows_gu*2*(part+1)/nth;
        tl->to_float(lo.data()+r0*lrs, tmp.data()+r0*n_gu,(r1-r0)*n_gu);
        if(mode==1) ggml_quantize_chunk(p.hi,tmp.data(),hi.data(),r0*n_gu,r1-r0,n_gu,nullptr);
        if(mode==2) cpu_hi->from_float(tmp.data()+r0*n_gu, hi.data()+r0*hrs,(r1-r0)*n_gu);
        size_t lb=lrs*rows_gu*2, hb=hrs*rows_gu*2; lrs=ggml_row_size(p.lo,n_d); hrs=ggml_row_size(p.hi,n_d);
        float* t2=tmp.data()+rows_gu*2*n_gu;
        r0=rows_d*part/nth; r1=rows_d*(part+1)/nth;
        tl->to_float(lo.data()+lb+r0*lrs,t2+r0*n_d,(r1-r0)*n_d);
        if(mode==1) ggml_quantize_chunk(p.hi,t2,hi.data()+hb,r0*n_d,r1-r0,n_d,nullptr);
        if(mode==2) cpu_hi->from_float(t2+r0*n_d,hi.data()+hb+r0*hrs,(r1-r0)*n_d);
      };
      for(int mode=0;mode<3;++mode){
        if(mode==2 && (!cpu_hi||!cpu_hi->from_float)) continue;
        double t0=now();
        std::vector<std::thread> th; for(int i=1;i<nth;++i) th.emplace_back(work,i,mode); work(0,mode); for(auto&t:th)t.join();
        double dt=now()-t0;
        double& b = mode==0?best_deq:mode==1?best_ref:best_cpu; if(dt<b)b=dt;
      }
    }
    double read_hi_25 = hi_bytes/2.5e9, read_lo_25=lo_bytes/2.5e9;
    double conv = best_cpu<1e9?best_cpu:best_ref;
    // break-even read rate R: lo/R + conv = hi/R  => R = (hi-lo)/conv
    printf("threads=%d %-7s->%-5s lo=%6.2f MB hi=%6.2f MB  dequant %6.2f ms  deq+requant(ref) %7.2f ms  deq+requant(cpu) %7.2f ms | read hi@2.5GB/s %5.2f ms, lo %5.2f ms | break-even read rate %.2f GB/s\n",
      nth, ggml_type_name(p.lo), ggml_type_name(p.hi), lo_bytes/1e6, hi_bytes/1e6, best_deq*1e3, best_ref*1e3, best_cpu<1e9?best_cpu*1e3:-1.0, read_hi_25*1e3, read_lo_25*1e3, (hi_bytes-(double)lo_bytes)/conv/1e9);
  }}
}
