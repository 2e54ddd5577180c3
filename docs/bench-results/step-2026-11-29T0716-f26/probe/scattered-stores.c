/* Cost of 64 single-line stores per "head" when the 64 lines are spread over
 * 64 distinct 4 KiB pages (K^T column: stride = row length) vs packed in 8 KiB. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  size_t total=(size_t)4<<30, head=(size_t)2<<20; /* 2 MiB per head region */
  uint8_t *m=mmap(NULL,total,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(m,total,MADV_HUGEPAGE); memset(m,1,total);
  size_t nh=total/head-2;
  for(int rep=0;rep<6;rep++){
    for(int mode=0;mode<3;mode++){
      size_t stride = mode==0 ? 33*1024+64 : mode==1 ? 128 : 64; /* spread / 8 KiB tile / 4 KiB contiguous */
      double t0=now(); volatile uint8_t sink=0;
      for(size_t h=0;h<nh;h++){ uint8_t *b=m+((h*7919)%nh)*head + (rep*64)%head; /* scattered heads */
        for(int j=0;j<64;j++) b[(size_t)j*stride]+=1; }
      double t=now()-t0; (void)sink;
      printf("rep %d mode %s: %.1f ns per line\n",rep,mode==0?"spread-33KiB":mode==1?"tile-128B":"contig-64B",t*1e9/(nh*64.0));
    }
  }
  return 0;
}
