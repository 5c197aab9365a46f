# The CPU demo = train.py's defaults, written out: a 4-layer byte-level GPT with
# GGD-BAM + SSMax on the synthetic passkey set (prompts of 512 bytes, key at a
# random depth), about 10 minutes on 2 CPU cores.
# tokens per iteration = batch_size * block_size * gradient_accumulation_steps
#                      = 8 * 512 * 1 = 4,096; 1,200 iterations = 4.9M tokens.
out_dir = "out"
dataset = "passkey_byte_512"
block_size = 512
batch_size = 8
gradient_accumulation_steps = 1
n_layer = 4
n_head = 4
n_embd = 128
pos = "bam"
ssmax = True
max_iters = 1200
