// Store umbrella: the key-value stores workers rendezvous through (TCPStore
// client and server, file, hash, prefix) and init methods (env://, tcp://,
// file://). Include as "ferry/store.h".
#ifndef FERRY_STORE_H_
#define FERRY_STORE_H_

#include "ferry/store/file_store.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/init_method.h"
#include "ferry/store/prefix_store.h"
#include "ferry/store/store.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/tcp_store_server.h"

#endif  // FERRY_STORE_H_
