# RULER NIAH on CPU: `python train.py config/niah_demo.py`, then `python niah.py --out_dir=out-niah`. The CPU demo's
# model and recipe (config/cpu_demo.py: a 2-layer byte-level GPT with GGD-BAM + SSMax, the same priors at init), trained
# on the synthetic set of RULER's eight NIAH tasks in turn (data/niah.py; docs/spec.md §9) instead of
# passkey prompts. Prompts of 512 bytes: the smallest power of two that holds every task's template with some haystack
# (multiquery needs 464 bytes, multikey 3's uuid needles 347; 320 holds neither), and the BAM paper's training length.
# tokens per iteration = batch_size * block_size * gradient_accumulation_steps = 8 * 512 * 1 = 4,096;
# 2,000 iterations = 8.2M tokens, about 15 minutes on 2 cores (a run beside two passkey demos took 63 minutes
# to their 45, and the passkey demo takes 11 alone). Status (docs/results.md, "RULER NIAH on CPU"): it learns the
# formats but not yet the lookup (0% at 1x on every task, seed 1337): a recipe in progress, not a result.
# No last phase on longer prompts (the passkey demo's): every iteration goes to the eight formats.
out_dir = "out-niah"
dataset = "niah_byte_512"
eval_interval = 500
block_size = 512
batch_size = 8
gradient_accumulation_steps = 1
n_layer = 2
n_head = 4
n_embd = 256
bias = False
pos = "bam"
ssmax = True
# layer 0 ALiBi (local heads), layer 1 three flat heads and one sub-linear: config/cpu_demo.py says why
bam_shape_init = [1, [0, 0, 0, 1 / 3]]
ssmax_init = 0.17
# SSMax counts at most 512 keys in layer 0 (the longest prompt it trains on; cpu_demo.py's cap, for its 1,280)
ssmax_max_n = [512, None]
learning_rate = 5e-4
max_iters = 2000
lr_decay_iters = 2000
