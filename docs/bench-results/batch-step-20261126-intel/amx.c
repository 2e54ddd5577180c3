#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) tilecfg;
int main(){
  if (syscall(SYS_arch_prctl,0x1023,18)) { perror("prctl"); return 1; }
  tilecfg c; memset(&c,0,sizeof c); c.palette=1;
  c.rows[0]=16; c.colsb[0]=64; /* C: 16 x 16 int32 */
  c.rows[1]=16; c.colsb[1]=32; /* A: 16 x 32 s8 */
  c.rows[2]=8;  c.colsb[2]=64; /* B: 8 x 64 u8 (K/4 x N*4) */
  _tile_loadconfig(&c);
  int8_t A[16][32]; uint8_t B[8][64]; int32_t C[16][16];
  for(int m=0;m<16;m++) for(int k=0;k<32;k++) A[m][k]=(int8_t)((m*7+k*3)%23-11);
  for(int k4=0;k4<8;k4++) for(int n=0;n<16;n++) for(int j=0;j<4;j++) B[k4][n*4+j]=(uint8_t)((k4*4+j)*5+n*11);
  _tile_zero(0); _tile_loadd(1,A,32); _tile_loadd(2,B,64); _tile_dpbsud(0,1,2); _tile_stored(0,C,64); _tile_release();
  int bad=0; for(int m=0;m<16;m++) for(int n=0;n<16;n++){ int32_t s=0; for(int k=0;k<32;k++) s+=A[m][k]*(int)B[k/4][n*4+k%4]; bad+=s!=C[m][n]; }
  printf("AMX dpbsud works, mismatches %d\n",bad); return 0; }
