/* Development harness (not built by make): 16 contexts over 4096-position shared prefixes, a one-token prefill each, then batched decode steps timed one by one. Build: gcc -O2 harness-decode-batch.c -Iinclude build/libsparq.a -lz -lm -fopenmp -lfaiss -lopenblas -lstdc++; run: ./a.out MODEL 16 4096 sparq */
#include "sparq.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  const char*path=argv[1]; int B=atoi(argv[2]); int depth=atoi(argv[3]); const char*attn=argc>4?argv[4]:"dense";
  char err[256]; sparq_model*m; sparq_model_params mp=sparq_model_default_params();
  if(sparq_model_load_params(path,&mp,&m,err,sizeof err)){fprintf(stderr,"%s\n",err);return 1;}
  sparq_context*c[64]; sparq_prefix*p[64];
  sparq_context_params cp=sparq_context_default_params(); cp.n_ctx=depth+64; cp.n_threads=2;
  if(!strcmp(attn,"sparq")){ cp.attn.policy="sparq"; cp.attn.k=254; cp.attn.r=8; }
  for(int i=0;i<B;i++){ sparq_context*src; if(sparq_context_create(m,&cp,&src,err,sizeof err)) return 1; sparq_context_fill_random(src,depth,i+1);
    if(sparq_prefix_create(src,depth,0,&p[i],err,sizeof err)){fprintf(stderr,"%s\n",err);return 1;} sparq_context_free(src);}
  fprintf(stderr,"ready\n"); if(getenv("SLEEP")) sleep(atoi(getenv("SLEEP")));
  int V=sparq_model_n_vocab(m); float*pl=malloc(sizeof(float)*V*B);
  double ta=0,tp=0;
  for(int i=0;i<B;i++){ double t0=now(); if(sparq_context_create(m,&cp,&c[i],err,sizeof err)) return 1;
    if(sparq_context_attach_prefix(c[i],p[i],depth,err,sizeof err)){fprintf(stderr,"%s\n",err);return 1;}
    double t1=now(); int32_t tt=77; if(sparq_eval_prefill(c[i],&tt,1,pl)) return 1; double t2=now(); ta+=t1-t0; tp+=t2-t1; }
  printf("create+attach %.2f ms each, prefill1 %.2f ms each\n",ta/B*1e3,tp/B*1e3);
  int32_t tok[64]; for(int i=0;i<B;i++)tok[i]=100+i;
  int NS=getenv("NSTEPS")?atoi(getenv("NSTEPS")):64; for(int w=0;w<NS;w++){ double a=now(); sparq_decode_batch(c,tok,B,pl); printf("%.0f ",(now()-a)*1e3);} printf("\n");
  return 0;}
