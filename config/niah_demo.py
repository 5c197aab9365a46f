# RULER NIAH on CPU: `python train.py config/niah_demo.py`, then `python niah.py --out_dir=out-niah`. The CPU demo's
# model and priors (config/cpu_demo.py: a 2-layer byte-level GPT with GGD-BAM + SSMax), trained in two parts in one
# run: first the passkey demo's 2,000 iterations on 320-byte passkey prompts, where the copy of a key forms (an
# induction circuit: the passkey answer repeats the bytes before the key), then a last phase of 800 iterations on
# 512-byte prompts of RULER's eight NIAH tasks in turn (data/niah.py; docs/spec.md §9), which teaches the formats.
# Trained on the NIAH set alone (2,000 iterations from scratch) the model learned the formats and never the lookup:
# 0% on every task (docs/results.md, "RULER NIAH on CPU"). 512 bytes is niah.py's 1x: the smallest power of two that
# holds every task's template with some haystack (multiquery needs 464 bytes, multikey 3's uuid needles 347), and
# the BAM paper's training length.
# tokens per iteration: 8 * 320 = 2,560 (passkey part), 8 * 512 = 4,096 (NIAH part); 2,800 iterations = 8.4M tokens,
# about 16 minutes on 2 cores (9.5 + 6.3, from the two parts' speeds alone: docs/results.md).
out_dir = "out-niah"
dataset = "passkey_byte_320"
train_block_size = 320  # the passkey part's window; block_size (below) is the NIAH prompts', niah.py's 1x
eval_interval = 400
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
max_iters = 2800
lr_decay_iters = 2000  # the cosine ends here, where the NIAH part begins
phase_from = 2000
phase_dataset = "niah_byte_512"
phase_train_block_size = 512
phase_batch_size = 8
phase_lr = 3e-4
