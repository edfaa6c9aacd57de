// Compiled only so that its target builds the precompiled header other targets reuse (cmake/Precompile.cmake).
