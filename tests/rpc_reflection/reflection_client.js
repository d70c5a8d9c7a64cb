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
const protobuf = require('protobufjs');

const address = process.argv[2];
if (!address) {
  console.error('usage: node reflection_client.js HOST:PORT');
  process.exit(2);
}
const creds = grpc.credentials.createInsecure();
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

// grpc.health.v1.Health is served by gRPC C++'s built-in health service,
// which reflection does not describe; its two messages are declared here
// (the standard grpc/health/v1/health.proto shapes).
const healthRoot = protobuf.Root.fromJSON({
  nested: {
    HealthCheckRequest: {fields: {service: {type: 'string', id: 1}}},
    HealthCheckResponse: {
      fields: {status: {type: 'ServingStatus', id: 1}},
      nested: {
        ServingStatus: {
          values: {UNKNOWN: 0, SERVING: 1, NOT_SERVING: 2, SERVICE_UNKNOWN: 3},
        },
      },
    },
  },
});

async function healthCheck(service) {
  const Req = healthRoot.lookupType('HealthCheckRequest');
  const Resp = healthRoot.lookupType('HealthCheckResponse');
  const Client = grpc.makeGenericClientConstructor({
    Check: {
      path: '/grpc.health.v1.Health/Check',
      requestStream: false,
      responseStream: false,
      requestSerialize: (o) => Buffer.from(Req.encode(Req.create(o)).finish()),
      requestDeserialize: (b) => Req.decode(b),
      responseSerialize: (o) => Buffer.from(Resp.encode(o).finish()),
      responseDeserialize: (b) =>
          Resp.toObject(Resp.decode(b), {enums: String, defaults: true}),
    },
  });
  const client = new Client(address, creds);
  try {
    return await unary(client, 'Check', {service});
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
  } finally {
    admin.close();
  }

  // 4. Health.
  result('health', await healthCheck(''));
  // Per-service status is optional in gRPC's health protocol (NOT_FOUND
  // when a server does not track it); report either answer.
  try {
    result('health_worker', await healthCheck('ferry.rpc.v1.Worker'));
  } catch (err) {
    result('health_worker_error', String(err.message));
  }
}

main().then(
    () => process.exit(0), (err) => {
      console.error(`reflection_client: ${err.stack || err}`);
      process.exit(1);
    });
