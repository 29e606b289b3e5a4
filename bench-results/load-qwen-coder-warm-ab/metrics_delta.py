import sys
def load(f):
    d = {}
    for line in open(f):
        if line.startswith("#") or not line.strip(): continue
        k, v = line.rsplit(" ", 1); d[k] = float(v)
    return d
for tag in sys.argv[2:]:
    b, a = load(f"{sys.argv[1]}/before-{tag}.txt"), load(f"{sys.argv[1]}/after-{tag}.txt")
    d = {k.split('{')[0].replace('specpipe_', '') + ('{' + k.split('{')[1] if 'le=' in k else ''): a[k] - b.get(k, 0) for k in a}
    print(tag, " ".join(f"{k}={v:.0f}" for k, v in d.items() if v and 'bucket' not in k))
    buckets = [(k.split('le=')[1].split(',')[0].strip('}"'), v) for k, v in d.items() if 'bucket' in k]
    print("   draft_ms buckets:", " ".join(f"{le}:{v:.0f}" for le, v in buckets))
    dr = d.get("drafted_tokens_total", 0); dc = d.get("draft_ms_count", 1)
    print(f"   drafts {dc:.0f}, mean draft ms {d.get('draft_ms_sum',0)/max(dc,1):.0f}; drafted/round {dr/d['rounds_total']:.3f}; accept {d.get('accepted_tokens_total',0)/max(dr,1):.2f}; sessions/forward {d['verify_batch_sessions_sum']/d['verify_batch_sessions_count']:.2f}")
