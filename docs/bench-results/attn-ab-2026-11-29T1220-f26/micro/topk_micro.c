#include "attn/attn.h"
#include "util/cpu.h"
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float rn(void){float u=(rand()+1.0f)/(RAND_MAX+2.0f),v=(rand()+1.0f)/(RAND_MAX+2.0f);return sqrtf(-2*logf(u))*cosf(6.2831853f*v);}
int main(int argc,char**argv){
  const int64_t S=argc>1?atoll(argv[1]):16384; const int d=64,g=3,r=8; int64_t k=S/16,l=k/4;
  _Float16 *KT=aligned_alloc(64,(size_t)d*S*2);
  for(int64_t i=0;i<(int64_t)d*S;i++) KT[i]=(_Float16)rn();
  float qs[3*8]; int32_t comp[8]; for(int c=0;c<r;c++){comp[c]=c*7%64;} for(int i=0;i<g*r;i++) qs[i]=rn()*1.5f;
  attn_kv_view kv; memset(&kv,0,sizeof kv); kv.S=S; kv.d=d; kv.elem=KV_F16; kv.KT=KT; kv.kt_stride=S;
  const int64_t nb=(S+ATTN_EXP_BLOCK-1)/ATTN_EXP_BLOCK;
  float *e=aligned_alloc(64,g*S*4),*scale=malloc(g*nb*4),*score=aligned_alloc(64,S*4);
  int32_t *work=aligned_alloc(64,S*4*2),*sel=malloc(k*4);
  double t[5]={0}; int reps=2000;
  for(int rep=0;rep<reps;rep++){
    double a=now(); attn_kt_exp(&kv,qs,comp,r,g,S,e,scale,NULL);
    double b=now(); attn_scaled_head_sum(e,scale,g,S,S-l,score);
    double c=now(); attn_topk_indices(score,S-l,k-l,sel,work); for(int64_t j=0;j<l;j++) sel[k-l+j]=S-l+j;
    double dd=now(); double al=0; for(int h=0;h<g;h++){for(int64_t j=0;j<k;j++) al+=(double)scale[h*nb+sel[j]/ATTN_EXP_BLOCK]*e[h*S+sel[j]];}
    double f=now(); t[0]+=b-a;t[1]+=c-b;t[2]+=dd-c;t[3]+=f-dd; if(al<0)puts("");
  }
  printf("S=%lld level=%d ktexp %.2f us headsum %.2f topk %.2f alpha %.2f\n",(long long)S,(int)cpu_level_get(),t[0]/reps*1e6,t[1]/reps*1e6,t[2]/reps*1e6,t[3]/reps*1e6);
  return 0;}
