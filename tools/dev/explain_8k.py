import torch, attnhub
for dt in (torch.bfloat16, torch.float16):
    q,k,v=(torch.randn(2,16,8192,128,device="cuda",dtype=dt) for _ in range(3))
    e=attnhub.explain(q,k,v)
    print(dt, e.chosen); print(str(e)[:1500])
