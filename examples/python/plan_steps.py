"""Plan packed micro-batches and CP shards for a document stream with wlb (numpy only).

    python examples/python/plan_steps.py
"""

import wlb

S, N, CP = 131072, 4, 4
packer = wlb.Packer("wlb-refine", context=S, micro_batches=N, cost="llama2-7b")
lengths = wlb.sample_default_lengths(20 * N * S, seed=7)  # or wlb.read_lengths("lengths.txt")
steps = wlb.split_into_steps(wlb.make_documents(lengths, S), N * S)

planned = []
for i, arrivals in enumerate(steps):
    for step in packer.push(arrivals):  # usually one ready step per push
        planned.append(step)
        mb = step.micro_batches[0]
        plan = wlb.plan_shards(mb, CP, "adaptive")
        if step.step < 3:
            print(f"step {step.step}: imbalance {step.imbalance:.3f} (bound "
                  f"{step.lower_bound:.3f}), tokens/micro-batch {step.tokens.tolist()}, "
                  f"held back {step.held_back_documents}")
            print(f"  micro-batch 0: {len(mb)} pieces, cu_seqlens {mb.cu_seqlens[:4].tolist()}..., "
                  f"CP {plan.strategy}: rank tokens {[r.tokens for r in plan.ranks]}")
    if i == 9:
        checkpoint = packer.state_dict()  # {'packer_state': C++ SaveState blob, ...}
        resumed = wlb.Packer("wlb-refine", context=S, micro_batches=N, cost="llama2-7b")
        resumed.load_state_dict(checkpoint)
        rest = [s for a in steps[10:] for s in resumed.push(a)] + resumed.flush()
planned += packer.flush()

summary = wlb.summarize(planned)
print(f"{summary['steps']} steps: mean imbalance {summary['imbalance_mean']:.3f}, "
      f"lower bound {summary['lower_bound_mean']:.3f}, mean token delay "
      f"{summary['delay_mean']:.2f} steps")
same = [s.to_json() for s in rest] == [s.to_json() for s in planned[len(planned) - len(rest):]]
print("resumed plan matches" if same else "resumed plan DIFFERS")
