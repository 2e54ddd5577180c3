/* harness-q8i-stream.c - usage: harness g S reps f16(0|1); build as harness-q8i-kernels.c. */
/* out-of-cache: T threads, each its own kv head of S rows, scores + wsum per part of 4096 rows (like attn_dense_part) */
#include "attn/attn.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int d=64,g=argc>1?atoi(argv[1]):3; int64_t S=argc>2?atol(argv[2]):262144; int reps=argc>3?atoi(argv[3]):20; int f16=argc>4?atoi(argv[4]):0;
  int T=2; size_t rb=f16? (size_t)d*2 : attn_q8_row_bytes(d);
  uint8_t *K[2],*V[2];
  for(int t=0;t<T;t++){K[t]=aligned_alloc(64,(S*rb+63)/64*64);V[t]=aligned_alloc(64,(S*rb+63)/64*64);}
  #pragma omp parallel num_threads(2)
  { int t=omp_get_thread_num(); unsigned x=1+t; float row[512];
    for(int64_t i=0;i<S;i++) for(int kv=0;kv<2;kv++){ for(int j=0;j<d;j++){x=x*1103515245+12345;row[j]=((x>>8)&0xffff)/32768.0f-1;}
      uint8_t *dst=(kv?V[t]:K[t])+i*rb; if(f16){ for(int j=0;j<d;j++){ _Float16 h=(_Float16)row[j]; memcpy(dst+2*j,&h,2);} } else attn_q8_quantize_row(row,d,dst);} }
  double best=1e9, tot[64]; int nrep=0;
  float *sc[2]; for(int t=0;t<2;t++) sc[t]=malloc(g*4096*4);
  for(int r=0;r<reps;r++){ double t0=now();
    #pragma omp parallel num_threads(2)
    { int t=omp_get_thread_num(); float q[4*512], out[4*512], lse[4]; for(int j=0;j<g*d;j++) q[j]=((j*37)%17)/4.0f-2;
      attn_kv_view kv; memset(&kv,0,sizeof kv); kv.d=d; kv.elem=f16?KV_F16:KV_Q8_0;
      for(int64_t a=0;a<S;a+=4096){ kv.S=4096; kv.K=K[t]+a*rb; kv.V=V[t]+a*rb;
        attn_scores(&kv,q,g,NULL,4096,sc[t]); attn_softmax_weighted_sum(&kv,sc[t],g,NULL,4096,out,lse);} }
    double dt=now()-t0; if(dt<best)best=dt; tot[nrep++%64]=dt; }
  double bytes=2.0*T*S*rb;
  printf("%s g %d S %ld: best %.0f us  %.1f GB/s\n", f16?"f16 ":"q8_0",g,(long)S,best*1e6,bytes/best/1e9);
}
