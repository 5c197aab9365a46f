# Tiny Shakespeare, byte-level (first: python data/shakespeare.py --tokenizer byte).
# A small model that trains on a laptop CPU in a few minutes; any --pos works.
# tokens per iteration = batch_size * block_size * gradient_accumulation_steps
#                      = 16 * 256 * 1 = 4,096; 2,000 iterations = 8.2M tokens (~8 epochs of 1M bytes).
out_dir = "out-shakespeare-byte"
dataset = "shakespeare_byte"
eval_interval = 250
eval_iters = 20
block_size = 256
batch_size = 16
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.1
bias = False
pos = "rope"
ssmax = False
learning_rate = 2e-3
max_iters = 2000
lr_decay_iters = 2000  # the cosine's end; a longer --max_iters stays at min_lr after it
warmup_iters = 100
