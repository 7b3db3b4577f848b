"""R3GAN "config E" ImageNet at 64x64, class-conditional (Huang et al. 2024, arXiv:2501.05441).

    python -m tf_gan_scale.main --config=experiments/r3gan_imagenet64.py \
        --workdir=/tmp/r3gan_imagenet64 --strategy=mirrored

The official preset (brownvc/R3GAN train.py:249-266; README: --gpus=64 --batch=4096
--mirror=1 --aug=1 --cond=1 --preset=ImageNet-64), frozen by `configs.r3gan("imagenet64")`:
widths 1536 x5 (4x4..64x64), 2 blocks per stage, cardinality 96 (32 channels per group), G
stages 8..64 / D 64..8 in bfloat16; noise 64, expansion 2, global batch 4096. G 103,570,432
and D 107,205,120 parameters, exactly the official's (counted by building its networks:
tests/architectures/test_r3gan.py). Data: tfds:imagenet_resized/64x64 (downsampled ImageNet,
1000 classes; the official prepares its own imagenet-64x64.zip with dataset_tool.py, which
may resize differently).

The official schedules (cosine over T = 2e8 images, no warm-up, constant after; all start at
the first value): lr 2e-4 -> 5e-5 (G and D), Adam beta_2 0.9 -> 0.99 (beta_1 0, eps 1e-8),
gamma (R1 = R2 weight) 1 -> 0.1, EMA half-life 0 -> 50,000,000 images, augmentation p 0 ->
0.4 (not adaptive; R3GAN's pipe: 'bgc' with the colour probabilities halved, plus cutout).
configs.r3gan sets them all (config.train.cosine; augment "r3gan"). num_steps = T / batch
(48,829), the schedules' end: the official code sets no training length. Not here:
--mirror=1 (x-flipped copies of the data).

Hardware and cost: 64 GPUs in the README (batch 64 per GPU; the official launcher is
single-node, so that command does not run as written); not measured on a GPU here. Expected
result: the paper reports FID 2.09 (its protocol: fid50k_full of the EMA generator); not
reproduced here.

At 64 accelerators (8 hosts x 8 GPUs, 64 examples per GPU; docs/r3gan.md, "ImageNet
at 32 and 64 accelerators": the data, the cost model, memory). Prepare the data once, then
Slurm (experiments/slurm/train.sbatch, one task per host) or Kubernetes:

    python tools/prepare_data.py --source=tfds:imagenet_resized/64x64 \
        --tfds_data_dir=/shared/tfds --out=/shared/data/imagenet64
    sbatch --job-name=r3gan_in64 --nodes=8 --ntasks-per-node=1 --gpus-per-task=8 \
        --cpus-per-task=32 --export=ALL,WORKDIR=/shared/runs/r3gan_imagenet64 \
        experiments/slurm/train.sbatch experiments/r3gan_imagenet64.py \
        --config.data.source=arrayrecord:/shared/data/imagenet64
    python tools/k8s_manifest.py --name=r3gan-in64 --num_workers=8 \
        --image=REGISTRY/tf_gan_scale --gpus_per_worker=8 --cpu=32 --memory=256Gi \
        --volume_claim=runs -- python -m tf_gan_scale.main \
        --strategy=multi_worker_mirrored --peer_timeout_s=60 --startup_timeout_s=900 \
        --config=experiments/r3gan_imagenet64.py \
        --workdir=/workdir/r3gan_imagenet64 \
        --config.data.source=arrayrecord:/workdir/data/imagenet64 | kubectl apply -f -

Cost model (not measured on a GPU): 92% data-parallel efficiency at 50 TFLOP/s per GPU and
25 Gbit/s (a step of 5.77 + 0.54 s: 86 hours for num_steps). Per GPU: 2.9 GB of weights,
Adam and EMA (3.4 GB with D's gradients); the activations dominate (an estimate in
docs/r3gan.md).
"""

from tf_gan_scale import configs


def get_config():
    c = configs.r3gan("imagenet64")
    return c
