// Telling whether two processes share a host, for same-host fast paths
// (c10d's shared-memory backend, the RPC agent's same-host channel).
//
// HostIdentity() names this process's view of the machine: the kernel's boot
// id, the device/inode of /dev/shm and the inode of the network namespace.
// Two processes with equal non-empty identities run under one kernel, see
// one /dev/shm and share a network namespace. Processes in different network
// namespaces count as different hosts (that is how tests emulate hosts, and
// it keeps such groups on the network), although they could share memory.
//
// Thread safety: the functions are stateless and thread-safe.
#ifndef FERRY_COMMON_SAME_HOST_H_
#define FERRY_COMMON_SAME_HOST_H_

#include <cstdint>
#include <string>

namespace ferry {

// "" when /proc or /dev/shm cannot be read (never equal to another host).
std::string HostIdentity();

// False once `pid` has exited, also while it is an unreaped zombie (a
// launcher may reap its children late).
bool ProcessAlive(int64_t pid);

}  // namespace ferry

#endif  // FERRY_COMMON_SAME_HOST_H_
