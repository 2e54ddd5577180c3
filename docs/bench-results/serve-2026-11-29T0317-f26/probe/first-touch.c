#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
#include <sys/mman.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){ size_t B=(size_t)256<<20;
 for(int mode=0;mode<3;mode++) for(int r=0;r<2;r++){ double t=now(); char*w=mmap(0,B,3,MAP_PRIVATE|MAP_ANONYMOUS|(mode==1?MAP_POPULATE:0),-1,0);
  if(mode==2) madvise(w,B,MADV_HUGEPAGE); memset(w,1,B); double t2=now();
  memset(w,2,B); double t3=now();
  printf("mode %d round %d: first %.1f ms, second %.1f ms\n",mode,r,(t2-t)*1e3,(t3-t2)*1e3); munmap(w,B);} return 0;}
