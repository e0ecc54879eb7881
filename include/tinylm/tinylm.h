// tinylm: tiny transformer language models on LibTorch. The umbrella header of the core
// library (tinylm::tinylm). The run layer, a run described by the tool's flat settings,
// is apart: tinylm/run.h (which includes tinylm/config.h), linked as tinylm::run.
#pragma once

#include <tinylm/batch_decoder.h>
#include <tinylm/data/prepare.h>
#include <tinylm/data/tasks.h>
#include <tinylm/data/token_file.h>
#include <tinylm/data/tokenizer.h>
#include <tinylm/error.h>
#include <tinylm/generate.h>
#include <tinylm/interop.h>
#include <tinylm/onnx.h>
#include <tinylm/nn/attention.h>
#include <tinylm/nn/block.h>
#include <tinylm/nn/cpu_kernels.h>
#include <tinylm/nn/embedding.h>
#include <tinylm/nn/kernel_policy.h>
#include <tinylm/log.h>
#include <tinylm/nn/model.h>
#include <tinylm/nn/model_kind.h>
#include <tinylm/report.h>
#include <tinylm/spec.h>
#include <tinylm/threads.h>
#include <tinylm/train/checkpoint.h>
#include <tinylm/train/optimizer.h>
#include <tinylm/train/resources.h>
#include <tinylm/train/run_directory.h>
#include <tinylm/train/trainer.h>
#include <tinylm/version.h>
