#include "attn/attn.h"
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static float rn(void){float u=(rand()+1.0f)/(RAND_MAX+2.0f),v=(rand()+1.0f)/(RAND_MAX+2.0f);return sqrtf(-2*logf(u))*cosf(6.2831853f*v);}
static inline float key_value(uint32_t k){const uint32_t b=k&0x80000000u?k&0x7fffffffu:~k;float v;memcpy(&v,&b,4);return v;}
int main(int argc,char**argv){
  int64_t S=argc>1?atoll(argv[1]):16384; int64_t kk=S/16,l=kk/4,n=S-l,k=kk-l;
  float *x=malloc(n*4); for(int64_t i=0;i<n;i++) x[i]=expf(rn()*2.0f)*1e-4f;
  uint32_t *key=malloc(n*8); int32_t *work=(int32_t*)key; int32_t *idx=malloc(k*4);
  double t[6]={0}; int reps=5000; int64_t cc=0;
  for(int rep=0;rep<reps;rep++){
    enum{SAMPLE=1024};
    double a=now();
    for(int64_t j=0;j<SAMPLE;j++) key[j]=attn_topk_key(x[j*n/SAMPLE]);
    const int64_t ks=2*((k*SAMPLE+n-1)/n)+16;
    double b=now();
    const float th=key_value(attn_topk_kth_select(key,SAMPLE,ks,key+SAMPLE,key+2*SAMPLE));
    double c=now();
    uint32_t *ck=key+n;
    const int64_t cn=attn_topk_filter(x,n,th,work,ck); cc=cn;
    double d=now();
    double e=now();
    uint32_t kt=attn_topk_kth_select(ck,cn,k,key+cn,ck+cn);
    double f=now();
    int64_t o=attn_topk_above(ck,work,cn,kt,idx); for(int64_t j=0;j<cn&&o<k;j++) if(ck[j]==kt) idx[o++]=work[j];
    double g=now();
    t[0]+=b-a;t[1]+=c-b;t[2]+=d-c;t[3]+=e-d;t[4]+=f-e;t[5]+=g-f;
  }
  printf("n=%lld k=%lld cand=%lld: sample %.2f kthS %.2f filter %.2f keys %.2f kthC %.2f emit %.2f us\n",(long long)n,(long long)k,(long long)cc,t[0]/reps*1e6,t[1]/reps*1e6,t[2]/reps*1e6,t[3]/reps*1e6,t[4]/reps*1e6,t[5]/reps*1e6);
}
