#include <stdio.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(){ uint32_t a,d; __asm__("xgetbv":"=a"(a),"=d"(d):"c"(0)); printf("XCR0=%#x tilecfg=%d tiledata=%d\n",a,(a>>17)&1,(a>>18)&1);
 long r=syscall(SYS_arch_prctl,0x1023,18); printf("ARCH_REQ_XCOMP_PERM: %ld\n",r); return 0;}
