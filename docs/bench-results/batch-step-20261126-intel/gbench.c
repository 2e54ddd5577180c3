/* GEMM alone: a 1b-sized Q8_0 product set streamed from DRAM, nt tokens */
#include "tensor/gemm.h"
#include "tensor/quant.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  int nt=atoi(argv[1]); int reps=argc>2?atoi(argv[2]):5; int pr=argc>3?atoi(argv[3]):96; int sched=argc>4?atoi(argv[4]):1;
  const int64_t n=2048; const int64_t rows_total=argc>5?atol(argv[5]):600000; /* ~1.3 GB at 2176 B/row */
  size_t rb=gemm_row_bytes(QT_Q8_0,n), ab=gemm_act_bytes(QT_Q8_0,n);
  uint8_t *W=aligned_alloc(2<<20,(rows_total*rb+(2<<20))/(2<<20)*(2<<20));
  for(size_t i=0;i<rows_total*rb;i+=1) W[i]=(uint8_t)(i*7+3);
  /* scales: keep finite f16: set every byte pattern is okay-ish; results unused */
  uint8_t *A=aligned_alloc(64,nt*ab); float *x=malloc(n*4); for(int i=0;i<n;i++) x[i]=(float)((i%13)-6)*0.1f;
  for(int t=0;t<nt;t++) gemm_pack_act(QT_Q8_0,x,n,A+t*ab);
  float *out=malloc((size_t)nt*rows_total*4);
  int64_t np=rows_total/pr;
  double best=1e9, sum=0;
  for(int r=0;r<reps;r++){
    double a=now();
    if(sched==1){
#pragma omp parallel for schedule(dynamic,1)
    for(int64_t p=0;p<np;p++) gemm_panel(QT_Q8_0,W+(size_t)p*pr*rb,pr,A,nt,n,out+p*pr,rows_total);
    } else {
#pragma omp parallel for schedule(static)
    for(int64_t p=0;p<np;p++) gemm_panel(QT_Q8_0,W+(size_t)p*pr*rb,pr,A,nt,n,out+p*pr,rows_total);
    }
    double d=now()-a; if(d<best)best=d; sum+=d;
  }
  double gop=2.0*rows_total*n*nt/1e9;
  printf("nt=%d pr=%d sched=%s: best %.1f ms mean %.1f ms, %.0f GOP/s, %.1f GB/s\n",nt,pr,sched?"dyn":"static",best*1e3,sum/reps*1e3,gop/best,rows_total*rb/best/1e9);
  return 0;
}
