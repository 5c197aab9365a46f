# The BAM paper's setting on one GPU (SPEC §7): a GPT-2-small-sized model
# (12 layers x 768, 16 heads of 48 dims, ~124M parameters with GPT-2's BPE) on
# FineWeb sample-10BT, training context 512. One preset for every variant: pick
# it with --pos (and --ssmax), e.g.
#   python data/fineweb.py --name sample-10BT
#   python train.py config/fineweb_gpt2s.py --pos=bam --ssmax=True --out_dir=out-bam-ssmax
#   torchrun --standalone --nproc_per_node=8 train.py config/fineweb_gpt2s.py --pos=rope
# tokens per iteration = batch_size * block_size * gradient_accumulation_steps
#                      = 32 * 512 * 16 = 262,144 (the accumulation is split over DDP processes);
# max_iters = 38,147 iterations * 262,144 = 10.0B tokens, one pass over sample-10BT.
# The fused kernels (--attn_impl=triton) take head dims 16/32/64/128: add --n_head=12 (64-dim heads) to use them.
out_dir = "out-fineweb"
dataset = "fineweb_sample-10BT"
eval_interval = 1000
eval_iters = 100
log_interval = 10
block_size = 512
batch_size = 32
gradient_accumulation_steps = 16
n_layer = 12
n_head = 16
n_embd = 768
dropout = 0.0
bias = False
pos = "bam"
ssmax = True
ssmax_init = 1.0  # the BAM code's init (SPEC §2)
rope_base = 10000.0
learning_rate = 6e-4
min_lr = 6e-5
max_iters = 38147
lr_decay_iters = 38147
warmup_iters = 700
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
compile = True
