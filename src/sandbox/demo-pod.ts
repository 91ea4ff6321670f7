/**
 * The demo's pod: its own process, whose every connection leaves from the pod's IP (a loopback
 * alias), fetching credentials with the AWS JS SDK's own instance-metadata provider exactly as an
 * application on EC2 does (token PUT, role GET, credentials GET). Reports to the demo over IPC.
 * Forked by the demo with the pod's IP and the SDK's timeout as arguments, and
 * AWS_EC2_METADATA_SERVICE_ENDPOINT set to the agent. With a third argument, `chain`, it uses the
 * SDK's default credential chain instead (the one an STSClient built with no credentials uses), which
 * takes the container-credentials provider when AWS_CONTAINER_CREDENTIALS_FULL_URI is set.
 */
import http from 'node:http';
import { STSClient } from '@aws-sdk/client-sts';
import { fromInstanceMetadata } from '@smithy/credential-provider-imds';
import type { PodReport } from './demo.js';

const [podIp, timeoutMs, provider] = process.argv.slice(2);
// The SDK's metadata client uses Node's global HTTP agent, so binding that agent's source address
// gives the SDK the pod's IP, as a pod's own network namespace would.
http.globalAgent = new http.Agent({ localAddress: podIp });

const started = performance.now();
const report = (message: PodReport) => process.send?.(message, undefined, {}, () => process.disconnect());
try {
  const credentials = await (provider === 'chain'
    ? new STSClient({}).config.credentials()
    : fromInstanceMetadata({ timeout: Number(timeoutMs), maxRetries: 0 })());
  report({
    kind: 'credentials',
    accessKeyId: credentials.accessKeyId,
    expiration: credentials.expiration?.toISOString() ?? '',
    elapsedMs: performance.now() - started,
  });
} catch (error) {
  report({
    kind: 'failed',
    error: `${(error as Error).name}: ${(error as Error).message}`,
    elapsedMs: performance.now() - started,
  });
}
