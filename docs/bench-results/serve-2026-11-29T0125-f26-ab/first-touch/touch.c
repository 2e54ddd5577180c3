#include <string.h>
#include <sys/mman.h>
int main(void){ size_t B=(size_t)20<<30; char*w=mmap(0,B,3,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); if(w==MAP_FAILED) return 1; memset(w,1,B); return 0; }
