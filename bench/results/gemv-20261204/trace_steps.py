import sys, collections
rows=[list(map(int,l.split())) for l in open(sys.argv[1])]
rows=rows[-6000:]
# step boundaries: launches >= 500us (lm_head)
idx=[i for i,r in enumerate(rows) if r[2]-r[0]>=500000]
steps=[rows[idx[k]+1:idx[k+1]+1] for k in range(len(idx)-1)]
L=collections.Counter(len(s) for s in steps); print("launches per step",L)
n=min(len(s) for s in steps)
per=len(steps[0])
acc=collections.defaultdict(lambda:[0,0,0,0,0])
for s in steps:
    if len(s)!=per: continue
    for i,r in enumerate(s):
        a=acc[i%5 if i<per-1 else 'head']
        a[0]+=r[2]-r[0]; a[1]+=r[1]-r[0]; a[2]+=r[2]-r[1]; a[3]+=r[4]-r[3]; a[4]+=1
    for i in range(1,len(s)):
        acc['gap'][0]+=s[i][0]-s[i-1][2]; acc['gap'][4]+=1
ns=len([s for s in steps if len(s)==per])
print("steps",ns)
for k,a in acc.items():
    print(k,"per step: dur %.3f ms  main %.3f  wait %.3f  worker fn %.3f  count %.1f"%(a[0]/ns/1e6,a[1]/ns/1e6,a[2]/ns/1e6,a[3]/ns/1e6,a[4]/ns))
