#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <omp.h>
#include <stdint.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
/* each thread: chunks of C bytes; "compute" = spin on registers for W iterations per line; 
   mode 0: demand loads only; mode 1: prefetch next chunk during compute on current (L2-resident) chunk */
int main(int argc,char**argv){
  size_t N=(size_t)(argc>4?atoi(argv[4]):1300)<<20; int mode=atoi(argv[1]); int W=atoi(argv[2]); int reuse=atoi(argv[3]);
  uint8_t*b=mmap(NULL,N,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); madvise(b,N,MADV_HUGEPAGE); memset(b,1,N);
  const size_t C=65536;
  double best=1e9;
  for(int rep=0;rep<4;rep++){
  double a=now(); long long sink=0;
#pragma omp parallel reduction(+:sink)
  {
    int t=omp_get_thread_num(), T=omp_get_num_threads();
    size_t per=N/T, base=t*per; __m512i acc=_mm512_setzero_si512(), acc2=acc, acc3=acc, acc4=acc;
    for(size_t c=0;c+C<=per;c+=C){
      const uint8_t*p=b+base+c; const uint8_t*nx=p+C;
      for(int r=0;r<reuse;r++){
        for(size_t i=0;i<C;i+=64){
          if(mode==1 && c+2*C<=per){ int lines=(C/64+reuse*(C/64)-1)/(reuse*(C/64)); (void)lines; if(((i/64)%reuse)==r) _mm_prefetch((const char*)nx+i,_MM_HINT_T1);} 
          if(mode==2 && c+2*C<=per){ if(((i/64)%reuse)==r) _mm_prefetch((const char*)nx+i,_MM_HINT_T0);} 
          __m512i v=_mm512_load_si512(p+i);
          for(int w=0;w<W;w++){ acc=_mm512_dpbusd_epi32(acc,v,v); acc2=_mm512_dpbusd_epi32(acc2,v,v); acc3=_mm512_dpbusd_epi32(acc3,v,v); acc4=_mm512_dpbusd_epi32(acc4,v,v);} 
        }
      }
    }
    sink+=_mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(acc,acc2),_mm512_add_epi32(acc3,acc4)));
  }
  double d=now()-a; if(d<best)best=d; if(sink==42)printf("x");
  }
  printf("mode %d W %d reuse %d: %.1f ms (%.1f GB/s)\n",mode,W,reuse,best*1e3,N/best/1e9);
}
