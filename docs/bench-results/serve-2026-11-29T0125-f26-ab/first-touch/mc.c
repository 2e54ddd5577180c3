#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){ size_t B=94u<<20; int huge=argc>1;
 char*src=mmap(0,B,3,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); memset(src,1,B);
 for(int r=0;r<5;r++){ char*d=mmap(0,B,3,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0); if(huge) madvise(d,B,MADV_HUGEPAGE);
  double t=now(); memcpy(d,src,B); double t1=now(); memcpy(d,src,B); printf("first %.1f ms, again %.1f ms\n",(t1-t)*1e3,(now()-t1)*1e3); munmap(d,B);} }
