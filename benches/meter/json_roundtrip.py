# JSON encode and decode of a nested document.
import json

doc = {
    "users": [
        {"id": i, "name": f"user{i}", "tags": ["a", "b", str(i % 7)], "score": i * 1.5}
        for i in range(2_000)
    ]
}
total = 0
for _ in range(5):
    text = json.dumps(doc, sort_keys=True)
    doc = json.loads(text)
    total += len(text)
print(total, doc["users"][-1])
