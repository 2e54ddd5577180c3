#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <sys/mman.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(void){ size_t B=(size_t)94<<20; int fd=memfd_create("x",0); ftruncate(fd,B);
 char*w=mmap(0,B,3,MAP_SHARED,fd,0); memset(w,1,B);
 char*d=mmap(0,B,3,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0); madvise(d,B,MADV_HUGEPAGE);
 for(int r=0;r<4;r++){ double t=now(); memcpy(d,w,B); double t1=now(); volatile long s=0; for(size_t i=0;i<B;i+=4096) s+=d[i]; double t2=now();
  printf("copy %.1f ms, read %.1f ms\n",(t1-t)*1e3,(t2-t1)*1e3);} 
 for(int r=0;r<3;r++){ double t=now(); char*p=mmap(0,B,PROT_READ|PROT_WRITE,MAP_PRIVATE,fd,0); volatile long s=0; for(size_t i=0;i<B;i+=64) s+=p[i]; double t1=now(); printf("map+full read %.1f ms\n",(t1-t)*1e3); munmap(p,B);}
 for(int r=0;r<3;r++){ double t=now(); volatile long s=0; for(size_t i=0;i<B;i+=64) s+=d[i]; double t1=now(); printf("warm full read %.1f ms\n",(t1-t)*1e3);}
 return 0;}
