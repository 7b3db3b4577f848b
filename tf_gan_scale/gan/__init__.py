"""The GAN: its Keras model, the step math, the step's settings and its parts.

    model.py          GAN(keras.Model): Keras glue (fit, evaluate, predict, .keras files)
    step.py           GanStep: the per-replica step skeleton; Topology: an engine's seam
    step_inputs.py micro_batches.py lazy_phases.py ada_controller.py step_evaluation.py
                      the step's units: G's and D's inputs, accumulation, StyleGAN2's
                      lazy phases, ADA's p, held-out losses (docs/architecture.md)
    step_config.py    StepConfig: every knob of the step, validated once
    step_function.py  the traced loop around strategy.run, error translation
    losses.py penalties.py regularizers.py augment.py ema.py checks.py   its parts
    ada.py ada_pipes.py  StyleGAN2-ADA's AugmentPipe ("ada", R3GAN's "r3gan") and new p
"""

from tf_gan_scale.architectures.calls import call_generator, generate, is_conditional
from tf_gan_scale.gan.model import GAN
from tf_gan_scale.gan.step import (NONFINITE, NONFINITE_D, NONFINITE_G, REPLICAS, UNEVEN,
                                   GanStep, Topology)
from tf_gan_scale.gan.step_config import StepConfig

__all__ = ["GAN", "GanStep", "NONFINITE", "NONFINITE_D", "NONFINITE_G", "REPLICAS",
           "StepConfig", "Topology", "UNEVEN", "call_generator", "generate",
           "is_conditional"]
