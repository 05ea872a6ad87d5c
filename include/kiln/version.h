#pragma once

namespace kiln {
extern const char* const kVersion;
extern const char* const kBuildType;
extern const char* const kCompiler;
extern const char* const kCudaArchitectures;
}  // namespace kiln
