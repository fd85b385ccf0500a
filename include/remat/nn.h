// remat/nn.h - the neural network layer in one include: modules and layers, containers whose
// children are checkpoint regions, the transformer pieces and a GPT model, convolution, pooling
// and batch norm layers and a CIFAR ResNet, einsum, losses, optimizers and safetensors weight
// files (and, through remat/remat.h, the core API).
#pragma once

#include "remat/remat.h"
#include "remat/nn/batch_norm.h"
#include "remat/nn/containers.h"
#include "remat/nn/conv.h"
#include "remat/nn/einsum.h"
#include "remat/nn/gpt.h"
#include "remat/nn/layers.h"
#include "remat/nn/loss.h"
#include "remat/nn/module.h"
#include "remat/nn/optim.h"
#include "remat/nn/resnet.h"
#include "remat/nn/safetensors.h"
#include "remat/nn/training_state.h"
#include "remat/nn/transformer.h"
