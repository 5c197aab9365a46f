# The CPU demo = train.py's defaults, written out: a 2-layer byte-level GPT with
# GGD-BAM + SSMax on the synthetic passkey set (prompts of 512 bytes, key at a
# random depth). It learns to retrieve the key: see README for the measured time.
# tokens per iteration = batch_size * block_size * gradient_accumulation_steps
#                      = 8 * 512 * 1 = 4,096; 5,000 iterations = 20.5M tokens.
# The copy of the key appears late, after a plateau of ~3,100 iterations (an
# induction circuit forming); learning_rate 1e-3 and ssmax_init 0.17 shorten it
# (the earlier 4-layer demo at lr 3e-3 stayed on it for all 1,200 of its iterations).
out_dir = "out"
dataset = "passkey_byte_512"
eval_interval = 500
block_size = 512
batch_size = 8
gradient_accumulation_steps = 1
n_layer = 2
n_head = 4
n_embd = 128
pos = "bam"
ssmax = True
ssmax_init = 0.17
learning_rate = 1e-3
max_iters = 5000
