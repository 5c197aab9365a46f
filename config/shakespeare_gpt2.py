# Tiny Shakespeare with GPT-2's BPE (first: python data/shakespeare.py --tokenizer gpt2).
# ~300k training tokens: a small model overfits soon, so keep dropout and few iterations.
# On 2 CPU cores: ~5 s an iteration and 4.8 GB (the 50,257-word output layer), ~50 s an evaluation;
# 1,000 iterations take well over an hour there. Meant for a GPU, or lower max_iters/batch_size.
# tokens per iteration = batch_size * block_size * gradient_accumulation_steps
#                      = 16 * 256 * 1 = 4,096; 1,000 iterations = 4.1M tokens (~12 epochs).
out_dir = "out-shakespeare-gpt2"
dataset = "shakespeare_gpt2"
eval_interval = 200
eval_iters = 20
block_size = 256
batch_size = 16
n_layer = 4
n_head = 4
n_embd = 256
dropout = 0.2
bias = False
pos = "rope"
ssmax = False
learning_rate = 1e-3
max_iters = 1000
lr_decay_iters = 1000  # the cosine's end; a longer --max_iters stays at min_lr after it
warmup_iters = 100
