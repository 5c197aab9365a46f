# The BAM paper's setting on one GPU (SPEC §7): a GPT-2-small-sized model
# (12 layers x 768, 16 heads of 48 dims, ~124M parameters with GPT-2's BPE) on
# FineWeb sample-10BT, training context 512. One preset for every variant: pick
# it with --pos (and --ssmax), e.g.
#   python data/fineweb.py --name sample-10BT
#   python train.py config/fineweb_gpt2s.py --pos=bam --ssmax=True --out_dir=out-bam-ssmax
#   torchrun --standalone --nproc_per_node=8 train.py config/fineweb_gpt2s.py --pos=rope --attn_impl=torch
# tokens per iteration = batch_size * block_size * gradient_accumulation_steps
#                      = 32 * 512 * 16 = 262,144 (the accumulation is split over DDP processes);
# max_iters = 38,147 iterations * 262,144 = 10.0B tokens, one pass over sample-10BT.
# Attention runs on the fused kernels of kernels.py, which exist for pos=bam and pos=tapa: every other
# variant needs --attn_impl=torch (GPT refuses triton for them).
# Each window attends within its documents (document_mask: the shards begin every document with EOT; a
# document cut by the window's start counts from the window's first token); --document_mask=False turns it off.
out_dir = "out-fineweb"
dataset = "fineweb_sample-10BT"
document_mask = True
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
attn_impl = "triton"
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
