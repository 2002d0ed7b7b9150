# String building, formatting and hashing.
import hashlib

parts = []
for i in range(30_000):
    parts.append(f"{i:08x}:{i * i % 10007}")
blob = "|".join(parts)
print(len(blob), hashlib.sha256(blob.encode()).hexdigest()[:16], blob.count("ff"))
