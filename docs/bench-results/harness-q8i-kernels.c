/* harness-q8i-kernels.c - the Q8_0 integer attention kernels alone, one thread, rows in cache.
 * usage: harness g S reps; build: gcc -O2 -march=native -Isrc -Iinclude THIS build/libsparq.a -lz -lm -fopenmp -lfaiss -lopenblas -lstdc++ */
#include "attn/attn.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int d=64,g=argc>1?atoi(argv[1]):3; int64_t S=argc>2?atol(argv[2]):4096; int reps=argc>3?atoi(argv[3]):200;
  size_t rb=attn_q8_row_bytes(d);
  uint8_t *K=aligned_alloc(64,(S*rb+63)/64*64),*V=aligned_alloc(64,(S*rb+63)/64*64);
  float *row=malloc(d*4); unsigned x=1;
  for(int64_t i=0;i<S;i++){for(int j=0;j<d;j++){x=x*1103515245+12345;row[j]=((x>>8)&0xffff)/32768.0f-1;} attn_q8_quantize_row(row,d,K+i*rb);
    for(int j=0;j<d;j++){x=x*1103515245+12345;row[j]=((x>>8)&0xffff)/32768.0f-1;} attn_q8_quantize_row(row,d,V+i*rb);}
  float *q=malloc(g*d*4),*s=malloc(g*S*4),*out=malloc(g*d*4),lse[8];
  for(int j=0;j<g*d;j++){x=x*1103515245+12345;q[j]=((x>>8)&0xffff)/8192.0f-4;}
  attn_kv_view kv; memset(&kv,0,sizeof kv); kv.S=S; kv.d=d; kv.elem=KV_Q8_0; kv.K=K; kv.V=V;
  double bs=1e9,bw=1e9; 
  for(int r=0;r<reps;r++){double t0=now(); attn_scores_q8i_avx512(&kv,q,g,NULL,S,s); double t1=now(); attn_softmax_weighted_sum_q8i_avx512(&kv,s,g,NULL,S,out,lse); double t2=now();
    if(t1-t0<bs)bs=t1-t0; if(t2-t1<bw)bw=t2-t1;}
  printf("g %d S %ld scores %.2f us  wsum %.2f us  (%.1f / %.1f ns per 64 rows) chk %g\n",g,(long)S,bs*1e6,bw*1e6,bs*1e9/(S/64),bw*1e9/(S/64),out[0]+out[d-1]);
}
