#include "ferry/tests/util/test_pki.h"

#include <sys/stat.h>

#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry::testutil {
namespace {

absl::Status Openssl(std::vector<std::string> args) {
  args.insert(args.begin(), "openssl");
  args.insert(args.begin(), "/usr/bin/env");
  auto [rc, output] = RunCommand(args, {}, absl::Seconds(30));
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("openssl ", args[2], " failed (", rc, "): ", output));
  }
  return absl::OkStatus();
}

absl::Status MakeCa(const std::string& dir, const std::string& name) {
  return Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt",
                  "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                  "-subj", absl::StrCat("/CN=Ferry test ", name), "-addext",
                  "basicConstraints=critical,CA:TRUE", "-addext",
                  "keyUsage=critical,keyCertSign,cRLSign", "-keyout",
                  absl::StrCat(dir, "/", name, ".key"), "-out",
                  absl::StrCat(dir, "/", name, ".pem")});
}

absl::StatusOr<TestIdentity> MakeLeaf(const std::string& dir,
                                      const std::string& name,
                                      const std::string& ca,
                                      const std::string& extra_san = "") {
  TestIdentity id{absl::StrCat(dir, "/", name, ".pem"),
                  absl::StrCat(dir, "/", name, ".key")};
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  const std::string ext = absl::StrCat(dir, "/", name, ".ext");
  std::ofstream(ext) << "subjectAltName=IP:127.0.0.1,DNS:localhost"
                     << extra_san << "\n"
                        "basicConstraints=critical,CA:FALSE\n"
                        "keyUsage=critical,digitalSignature,keyEncipherment\n"
                        "extendedKeyUsage=serverAuth,clientAuth\n";
  absl::Status s =
      Openssl({"req", "-newkey", "ec", "-pkeyopt",
               "ec_paramgen_curve:prime256v1", "-nodes", "-subj",
               absl::StrCat("/CN=", name), "-keyout", id.key, "-out", csr});
  if (!s.ok()) return s;
  s = Openssl({"x509", "-req", "-in", csr, "-CA",
               absl::StrCat(dir, "/", ca, ".pem"), "-CAkey",
               absl::StrCat(dir, "/", ca, ".key"), "-CAcreateserial", "-days",
               "2", "-extfile", ext, "-out", id.cert});
  if (!s.ok()) return s;
  return id;
}

}  // namespace

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  mkdir(dir.c_str(), 0700);
  TestPki pki;
  for (const char* ca : {"ca", "rogue_ca"}) {
    if (absl::Status s = MakeCa(dir, ca); !s.ok()) return s;
  }
  pki.ca = dir + "/ca.pem";
  pki.rogue_ca = dir + "/rogue_ca.pem";
  absl::StatusOr<TestIdentity> alice = MakeLeaf(dir, "alice", "ca");
  if (!alice.ok()) return alice.status();
  absl::StatusOr<TestIdentity> bob = MakeLeaf(dir, "bob", "ca");
  if (!bob.ok()) return bob.status();
  absl::StatusOr<TestIdentity> rogue = MakeLeaf(dir, "rogue", "rogue_ca");
  if (!rogue.ok()) return rogue.status();
  pki.alice = *alice;
  pki.bob = *bob;
  pki.rogue = *rogue;
  return pki;
}

absl::StatusOr<TestIdentity> MakeWorkerIdentity(const std::string& dir,
                                                const std::string& worker) {
  return MakeLeaf(dir, absl::StrCat("worker_", worker), "ca",
                  absl::StrCat(",DNS:", worker));
}

}  // namespace ferry::testutil
