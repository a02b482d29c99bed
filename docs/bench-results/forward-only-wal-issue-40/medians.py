import re,sys,glob,statistics,collections
d=sys.argv[1]
rows=collections.defaultdict(list)
for f in sorted(glob.glob(d+'/*.md')):
    name=f.split('/')[-1][:-3]
    if name in ('results',): continue
    var=name.split('-')[0]
    seen=collections.Counter()
    for l in open(f):
        m=re.search(r'latency (\S+) at (\d+) msg/s: \d+ of \d+ received .*?p50 ([\d.]+) ms.*?p99 ([\d.]+),.*?CPU ([\d.]+) µs/msg',l)
        c=re.search(r'latency ceiling at (\d+) msg/s: .*CPU ([\d.]+) µs/msg',l)
        if m:
            sys_,load=m.group(1),m.group(2)
            seen[(sys_,load)]+=1
            prof='LowLatency' if seen[(sys_,load)]==1 and sys_!='peer' else ('Default' if sys_!='peer' else '')
            rows[(var,sys_,prof,load)].append((float(m.group(3)),float(m.group(4)),float(m.group(5))))
        elif c:
            rows[(var,'ceiling','',c.group(1))].append((0,0,float(c.group(2))))
print('| variant | system | profile | load | runs | p50 ms | p99 ms | CPU µs/msg |')
print('|---|---|---|---|---|---|---|---|')
for k in sorted(rows):
    v=rows[k]
    med=lambda i: statistics.median([x[i] for x in v])
    print(f'| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {len(v)} | {med(0):.1f} | {med(1):.1f} | {med(2):.0f} |')
