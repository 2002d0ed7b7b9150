# A sieve of Eratosthenes: list indexing and slice assignment.
N = 300_000
is_prime = bytearray([1]) * (N + 1)
is_prime[0:2] = b"\x00\x00"
for i in range(2, int(N**0.5) + 1):
    if is_prime[i]:
        is_prime[i * i :: i] = bytes(len(range(i * i, N + 1, i)))
primes = [i for i, p in enumerate(is_prime) if p]
print(len(primes), primes[-1])
