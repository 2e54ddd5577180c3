# Medians (min..max) over the three rounds of attn-r*.log: µs per call, per commit, policy and query kind.
import re, collections
res = collections.defaultdict(list)
for r in (1, 2, 3):
    cur = None
    for line in open(f'attn-r{r}.log'):
        if line.startswith('#'):
            c = re.search(r'sparq-(\w+) ', line).group(1)
            cur = (c, 'heavy-tailed' if 'heavy' in line else 'plain')
        else:
            f = line.split()
            res[(cur, f[0])].append(float(f[10]))  # median_us column
print('| queries | policy | 685fa1e | 50c43a8 | 6971e25 | 27ed68f |')
print('|---|---|---:|---:|---:|---:|')
for h in ('plain', 'heavy-tailed'):
    for pol in ('dense', 'sparq'):
        cells = []
        for c in ('685fa1e', '50c43a8', '6971e25', '27ed68f'):
            v = sorted(res[((c, h), pol)])
            cells.append(f'{v[1]:.0f} ({v[0]:.0f}..{v[2]:.0f})')
        print(f'| {h} | {pol} | ' + ' | '.join(cells) + ' |')
