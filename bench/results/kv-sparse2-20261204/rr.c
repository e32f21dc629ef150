#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#define BUF ((size_t)1 << 30)
#define BLK 2176
#define NB 20000
static char *buf;
static int D, HINT, MODE, LINES_PF;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
typedef struct { size_t off[NB]; double sec; long sum; int id; } th;
static pthread_barrier_t bar;
static void pf(const char *p){ int n = (BLK+63)/64; int step = LINES_PF; for(int l=0;l<n;l+=step){ if(HINT==0) _mm_prefetch(p+l*64,_MM_HINT_T0); else _mm_prefetch(p+l*64,_MM_HINT_T1);} }
static void *run(void *arg){
  th *t=arg; cpu_set_t cs; CPU_ZERO(&cs); CPU_SET(t->id,&cs); pthread_setaffinity_np(pthread_self(),sizeof cs,&cs);
  __m512i acc=_mm512_setzero_si512();
  pthread_barrier_wait(&bar);
  double t0=now();
  for(int i=0;i<NB;i++){
    if(D>0 && i+D<NB) pf(buf+t->off[i+D]);
    if(D>0 && i==0) for(int j=1;j<D&&j<NB;j++) pf(buf+t->off[j]);
    const char*p=buf+t->off[i];
    for(int l=0;l<BLK/64;l++) acc=_mm512_add_epi32(acc,_mm512_loadu_si512(p+l*64));
    if (MODE) { /* some compute per block ~ */ for(int k=0;k<MODE;k++) acc=_mm512_add_epi32(_mm512_mullo_epi32(acc,acc),acc);} 
  }
  t->sec=now()-t0; t->sum=_mm512_reduce_add_epi32(acc); return NULL;
}
int main(int argc,char**argv){
  int nth=atoi(argv[1]); D=atoi(argv[2]); HINT=atoi(argv[3]); LINES_PF=atoi(argv[4]); MODE=argc>5?atoi(argv[5]):0;
  buf=mmap(NULL,BUF+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  buf=(char*)(((uintptr_t)buf+(2<<20)-1)&~(uintptr_t)((2<<20)-1)); madvise(buf,BUF,MADV_HUGEPAGE); memset(buf,1,BUF);
  th *ts=calloc(nth,sizeof(th)); pthread_t p[4]; pthread_barrier_init(&bar,NULL,nth);
  srand(1);
  for(int r=0;r<5;r++){
    for(int k=0;k<nth;k++){ ts[k].id=k; for(int i=0;i<NB;i++) ts[k].off[i]=((size_t)rand()*64)%(BUF-8192); }
    for(int k=0;k<nth;k++) pthread_create(&p[k],NULL,run,&ts[k]);
    double mx=0; for(int k=0;k<nth;k++){pthread_join(p[k],NULL); if(ts[k].sec>mx)mx=ts[k].sec;}
    printf("%.2f ", (double)nth*NB*BLK/mx/1e9);
  }
  printf(" GB/s  nth=%d D=%d hint=%s lines/%d compute=%d\n",nth,D,HINT?"T1":"T0",LINES_PF,MODE);
}
