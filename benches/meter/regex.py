# Regular expressions over generated text.
import re

words = ["alpha", "beta", "gamma", "delta", "epsilon"]
text = " ".join(f"{words[i % 5]}{i}@example{i % 13}.org" for i in range(20_000))
emails = re.findall(r"([a-z]+)(\d+)@example(\d+)\.org", text)
replaced = re.sub(r"\d+", "#", text[:2000])
print(len(emails), emails[-1], replaced[:40])
