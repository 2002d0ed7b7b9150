# Seeded random numbers, sorting and a dict of counts.
import random

rng = random.Random(7)
xs = [rng.randrange(1_000_000) for _ in range(50_000)]
xs.sort()
counts = {}
for x in xs:
    counts[x % 97] = counts.get(x % 97, 0) + 1
print(xs[0], xs[len(xs) // 2], xs[-1], max(counts.values()))
