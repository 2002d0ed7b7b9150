# The README's resume-cost figure: a prefix of 50 tool calls and some compute, a call that
# waits for approval (`--approve echo`), then a suffix. `scripts/resume-cost` measures it.
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

total = 0
for i in range(50):
    r = await add(a=total, b=i)
    total = r["sum"]
f = fib(22)
sent = await echo(text=f"{total} {f}")
g = fib(20)
return {"total": total, "fib": f, "sent": sent, "after": g}
