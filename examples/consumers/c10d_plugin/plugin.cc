// The plugin's entry point: registers examples/custom_backend's StoreBackend
// as "store" in the registry the loader passes (ferry/c10d/plugin.h).
#include "ferry/c10d.h"
#include "ferry/examples/custom_backend/store_backend.h"

FERRY_C10D_PLUGIN(registry) {
  return ferry::examples::RegisterStoreBackend(registry, "store");
}
