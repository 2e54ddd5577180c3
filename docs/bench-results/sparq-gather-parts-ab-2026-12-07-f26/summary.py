import json,glob,statistics as st,os,sys
D=sys.argv[1]
for cfg in ['smol32k-t2','smol32k-t1','l1b16k-t2','smol16k-np16']:
    rows={}
    for b in ['base','new']:
        v=[];vd=[]
        for r in range(1,6):
            f=f'{D}/{cfg}-{b}-r{r}.json'
            if not os.path.exists(f): continue
            J=json.load(open(f))
            for x in J:
                if x['depth']>0 and x['policy']=='sparq': v.append(x['tok_s'])
                if x['depth']>0 and x['policy']=='dense': vd.append(x['tok_s'])
        rows[b]=(v,vd)
    b,n=rows['base'][0],rows['new'][0]
    ratios=[y/x for x,y in zip(b,n)]
    print(f"{cfg}: sparq base median {st.median(b):.2f} ({min(b):.2f}-{max(b):.2f})  new median {st.median(n):.2f} ({min(n):.2f}-{max(n):.2f})  per-round new/base {', '.join(f'{r:.3f}' for r in ratios)} median {st.median(ratios):.3f}")
    bd,nd=rows['base'][1],rows['new'][1]
    print(f"   dense base median {st.median(bd):.2f} new median {st.median(nd):.2f}")
