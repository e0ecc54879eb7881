// Formats 1 and 2 stored no model architecture, only the run config (TOML) they were
// trained with. Reading the model out of it is this file's job alone, with the defaults
// those files were written with, frozen here: a change to today's run-config defaults or
// rules never changes what an old file rebuilds, and the core reads old files without the
// command line's config layer.
#pragma once

#include <tinylm/nn/model.h>

#include <string>

namespace tinylm::internal {

/// The architecture a format-1 or format-2 recipe describes. Keys other than the model's
/// are not read here; a model key of the wrong type is one line naming it.
nn::ModelArchitecture legacy_architecture(const std::string& recipe, const std::string& path);

}  // namespace tinylm::internal
