// Inspects a Ferry worker with third-party Node clients only: npm's
// grpc-js-reflection-client (server reflection, v1alpha) and @grpc/grpc-js.
//
//   NODE_PATH=<dir>/node_modules node reflection_client.js HOST:PORT
//
// Prints one line per finding, "RESULT <what> <json>", for
// reflection_test.cc to check; exits non-zero on any error.
'use strict';

const grpc = require('@grpc/grpc-js');
const {GrpcReflection} = require('grpc-js-reflection-client');

const fs = require('fs');

// With CA_FILE (and optionally CERT_FILE KEY_FILE): TLS (mutual TLS).
const [address, caFile, certFile, keyFile] = process.argv.slice(2);
if (!address) {
  console.error(
      'usage: node reflection_client.js HOST:PORT [CA_FILE [CERT KEY]]');
  process.exit(2);
}
const creds = caFile ?
    grpc.credentials.createSsl(
        fs.readFileSync(caFile), keyFile ? fs.readFileSync(keyFile) : null,
        certFile ? fs.readFileSync(certFile) : null) :
    grpc.credentials.createInsecure();
const deadline = () => new Date(Date.now() + 10000);

function result(what, value) {
  console.log(`RESULT ${what} ${JSON.stringify(value)}`);
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, {deadline: deadline()}, (err, response) => {
      if (err) reject(new Error(`${method}: ${err.code} ${err.details}`));
      else resolve(response);
    });
  });
}

// grpc.health.v1.Health through descriptors found by reflection (no .proto
// file on this side): Check, and the first answer of the Watch stream.
async function health(reflection) {
  const descriptor =
      await reflection.getDescriptorBySymbol('grpc.health.v1.Health');
  const pkg = descriptor.getPackageObject(
      {keepCase: true, enums: String, defaults: true});
  const client = new pkg.grpc.health.v1.Health(address, creds);
  try {
    result('health', await unary(client, 'Check', {service: ''}));
    // Per-service status is optional in gRPC's health protocol (NOT_FOUND
    // when a server does not track it); report either answer.
    try {
      result('health_worker',
             await unary(client, 'Check', {service: 'ferry.rpc.v1.Worker'}));
    } catch (err) {
      result('health_worker_error', String(err.message));
    }
    result('health_watch', await new Promise((resolve, reject) => {
      const call = client.Watch({service: ''}, {deadline: deadline()});
      call.on('data', (response) => {
        resolve(response);
        call.cancel();
      });
      call.on('error', (err) => {
        if (err.code !== grpc.status.CANCELLED) {
          reject(new Error(`Watch: ${err.code} ${err.details}`));
        }
      });
    }));
  } finally {
    client.close();
  }
}

async function main() {
  const reflection = new GrpcReflection(address, creds);

  // 1. List services.
  const services = await reflection.listServices();
  result('services', services);

  // 2. Describe the admin service: its methods, and its messages' fields.
  const methods = await reflection.listMethods('ferry.admin.v1.Admin');
  result('admin_methods', methods.map((m) => ({
    name: m.name,
    path: m.path,
    request: m.definition.requestType.type.name,
    response: m.definition.responseType.type.name,
  })));
  const descriptor =
      await reflection.getDescriptorBySymbol('ferry.admin.v1.Admin');
  const root = descriptor.getProtobufJsRoot();
  const info = root.lookupType('ferry.admin.v1.WorkerInfo');
  result('worker_info_fields', Object.keys(info.fields));

  // 3. Call the admin service with JSON, through a client built from the
  // reflected descriptor (no .proto file on this side).
  const pkg = descriptor.getPackageObject(
      {keepCase: true, longs: String, enums: String, defaults: true});
  const admin = new pkg.ferry.admin.v1.Admin(address, creds);
  try {
    result('worker_info', await unary(admin, 'GetWorkerInfo', {}));
    result('functions', await unary(admin, 'ListFunctions', {}));
    result('workers', await unary(admin, 'ListWorkers', {}));
    result('stats', await unary(admin, 'GetStats', {}));
    // Invoke a registered function with JSON arguments.
    result('invoke', await unary(admin, 'Invoke', {
      function: 'greet',
      args: {values: [{string_value: 'ops'}, {number_value: 2}]},
    }));
    try {
      await unary(admin, 'Invoke', {function: 'nope', args: {values: []}});
      result('invoke_unknown_error', 'none');
    } catch (err) {
      result('invoke_unknown_error', String(err.message));
    }
  } finally {
    admin.close();
  }

  // 4. Health, described by reflection.
  await health(reflection);
}

main().then(
    () => process.exit(0), (err) => {
      console.error(`reflection_client: ${err.stack || err}`);
      process.exit(1);
    });
