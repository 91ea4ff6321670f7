/**
 * What the webhook does to a pod, as a pure function: pod in, JSON patch and warnings out. It only
 * adds (a variable, a volume, a mount, a label) and appends the credentials address to NO_PROXY;
 * it never replaces what the pod set, and a second pass over its own output adds nothing.
 */
import type { JsonPatchOperation, Pod, PodContainer } from './admission.js';

export const INJECT_ANNOTATION = 'kube-iam-broker.io/inject';
export const SKIP_CONTAINERS_ANNOTATION = 'kube-iam-broker.io/skip-containers';
export const TOKEN_EXPIRATION_ANNOTATION = 'kube-iam-broker.io/token-expiration';
export const WIRED_LABEL = 'kube-iam-broker.io/wired';
export const TOKEN_VOLUME = 'kube-iam-broker-token';
export const TOKEN_MOUNT_PATH = '/var/run/secrets/kube-iam-broker.io/serviceaccount';
export const TOKEN_FILE = `${TOKEN_MOUNT_PATH}/token`;

const FULL_URI = 'AWS_CONTAINER_CREDENTIALS_FULL_URI';
const TOKEN_FILE_VARIABLE = 'AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE';
/** Variables that mean the container already has its own AWS credentials: it is left as it is. */
const OWN_CREDENTIALS = [
  'AWS_ACCESS_KEY_ID',
  'AWS_WEB_IDENTITY_TOKEN_FILE',
  FULL_URI,
  TOKEN_FILE_VARIABLE,
  'AWS_CONTAINER_CREDENTIALS_RELATIVE_URI',
  'AWS_CONTAINER_AUTHORIZATION_TOKEN',
];
const PROXY_VARIABLES = ['HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy', 'ALL_PROXY', 'all_proxy'];
const NO_PROXY_VARIABLES = ['NO_PROXY', 'no_proxy'];
const EXPIRATION_RANGE = { min: 600, max: 86_400 };

export interface WiringSettings {
  /** AWS_CONTAINER_CREDENTIALS_FULL_URI, from BROKER_CONTAINER_LISTEN. */
  readonly credentialsUri: string;
  /** The host of that URI, as it goes into NO_PROXY. */
  readonly credentialsHost: string;
  readonly audience: string;
  readonly expirationSeconds: number;
}

/** Which MutatingWebhookConfiguration entry sent the pod: its namespace opted in, or only its annotation may. */
export type Selection = 'namespace' | 'annotation';

export type WiringOutcome = 'wired' | 'already-wired' | 'left-as-is' | 'opted-out' | 'not-selected';

export interface Wiring {
  readonly outcome: WiringOutcome;
  readonly patch: JsonPatchOperation[];
  readonly warnings: string[];
  /** Containers this patch wires, for the log line. */
  readonly containers: string[];
}

/** RFC 6901: `/` and `~` in a key are escaped. */
const pointerKey = (key: string) => key.replace(/~/g, '~0').replace(/\//g, '~1');

const add = (path: string, value: unknown): JsonPatchOperation => ({ op: 'add', path, value });

/** Appends value to the array at path, creating the array when the field is absent. */
const appendAll = (
  path: string,
  existing: readonly unknown[] | undefined,
  values: readonly unknown[],
): JsonPatchOperation[] =>
  values.length === 0
    ? []
    : existing === undefined
      ? [add(path, values)]
      : values.map((value) => add(`${path}/-`, value));

export function wirePod(pod: Pod, settings: WiringSettings, selection: Selection): Wiring {
  const annotations = pod.metadata.annotations ?? {};
  const request = annotations[INJECT_ANNOTATION];
  const none = (outcome: WiringOutcome, warnings: string[] = []): Wiring => ({
    outcome,
    patch: [],
    warnings,
    containers: [],
  });
  if (request === 'false') return none('opted-out');
  if (selection === 'annotation' && request !== 'true') return none('not-selected');

  const warnings: string[] = [];
  const expirationSeconds = tokenExpiration(
    annotations[TOKEN_EXPIRATION_ANNOTATION],
    settings.expirationSeconds,
    warnings,
  );
  const volume = {
    name: TOKEN_VOLUME,
    projected: {
      sources: [{ serviceAccountToken: { audience: settings.audience, expirationSeconds, path: 'token' } }],
    },
  };
  const existingVolume = pod.spec.volumes?.find((candidate) => candidate.name === TOKEN_VOLUME);
  if (existingVolume && !isOurTokenVolume(existingVolume, settings.audience)) {
    return none('left-as-is', [
      `volume "${TOKEN_VOLUME}" exists and is not kube-iam-broker's token: pod left as it is`,
    ]);
  }

  const skipped = new Set(
    (annotations[SKIP_CONTAINERS_ANNOTATION] ?? '')
      .split(',')
      .map((name) => name.trim())
      .filter(Boolean),
  );
  const patch: JsonPatchOperation[] = [];
  const wired: string[] = [];
  let alreadyWired = 0;
  const lists = [
    { path: '/spec/initContainers', containers: pod.spec.initContainers ?? [] },
    { path: '/spec/containers', containers: pod.spec.containers },
  ];
  for (const { path, containers } of lists) {
    containers.forEach((container, index) => {
      if (skipped.has(container.name)) return;
      const state = containerState(container, settings);
      if (state === 'wired') return void alreadyWired++;
      if (state !== 'free')
        return void warnings.push(
          `container "${container.name}" ${state}: left as it is, not wired to kube-iam-broker`,
        );
      patch.push(...wireContainer(container, `${path}/${index}`, settings, warnings));
      wired.push(container.name);
    });
  }
  if (wired.length === 0)
    return { outcome: alreadyWired > 0 ? 'already-wired' : 'left-as-is', patch: [], warnings, containers: [] };

  if (!existingVolume) patch.push(...appendAll('/spec/volumes', pod.spec.volumes, [volume]));
  if (pod.metadata.labels?.[WIRED_LABEL] !== 'true') {
    patch.push(
      pod.metadata.labels
        ? add(`/metadata/labels/${pointerKey(WIRED_LABEL)}`, 'true')
        : add('/metadata/labels', { [WIRED_LABEL]: 'true' }),
    );
  }
  return { outcome: 'wired', patch, warnings, containers: wired };
}

/** 'free' to wire, 'wired' by an earlier pass, or why it is left alone. */
type ContainerState = 'free' | 'wired' | `sets ${string}` | `mounts volume ${string}`;

function containerState(container: PodContainer, settings: WiringSettings): ContainerState {
  const env = new Map((container.env ?? []).map((variable) => [variable.name, variable]));
  const mount = container.volumeMounts?.find((candidate) => candidate.mountPath === TOKEN_MOUNT_PATH);
  if (
    env.get(FULL_URI)?.value === settings.credentialsUri &&
    env.get(TOKEN_FILE_VARIABLE)?.value === TOKEN_FILE &&
    mount?.name === TOKEN_VOLUME
  )
    return 'wired';
  const own = OWN_CREDENTIALS.filter((name) => env.has(name));
  if (own.length > 0) return `sets ${own.join(', ')}`;
  if (mount) return `mounts volume "${mount.name}" at ${TOKEN_MOUNT_PATH}`;
  return 'free';
}

function wireContainer(
  container: PodContainer,
  path: string,
  settings: WiringSettings,
  warnings: string[],
): JsonPatchOperation[] {
  const env = container.env ?? [];
  const additions: Array<{ name: string; value: string }> = [
    { name: FULL_URI, value: settings.credentialsUri },
    { name: TOKEN_FILE_VARIABLE, value: TOKEN_FILE },
  ];
  const replacements: JsonPatchOperation[] = [];
  if (env.some((variable) => PROXY_VARIABLES.includes(variable.name))) {
    const noProxy = env
      .map((variable, index) => ({ variable, index }))
      .filter(({ variable }) => NO_PROXY_VARIABLES.includes(variable.name));
    if (noProxy.length === 0)
      additions.push(...NO_PROXY_VARIABLES.map((name) => ({ name, value: settings.credentialsHost })));
    for (const { variable, index } of noProxy) {
      if (variable.value === undefined) {
        warnings.push(
          `container "${container.name}" takes ${variable.name} from elsewhere: add ${settings.credentialsHost} to it, or its proxy will receive credential requests`,
        );
        continue;
      }
      const entries = variable.value.split(',').map((entry) => entry.trim());
      if (entries.includes(settings.credentialsHost)) continue;
      replacements.push({
        op: 'replace',
        path: `${path}/env/${index}/value`,
        value:
          variable.value.trim() === '' ? settings.credentialsHost : `${variable.value},${settings.credentialsHost}`,
      });
    }
  }
  const mount = { name: TOKEN_VOLUME, mountPath: TOKEN_MOUNT_PATH, readOnly: true };
  return [
    ...replacements,
    ...appendAll(`${path}/env`, container.env, additions),
    ...appendAll(`${path}/volumeMounts`, container.volumeMounts, [mount]),
  ];
}

/** A volume of that name holding exactly one service-account token of our audience (an earlier pass, possibly with another expiration). */
function isOurTokenVolume(volume: Record<string, unknown>, audience: string): boolean {
  const sources = (volume.projected as { sources?: Array<{ serviceAccountToken?: { audience?: string } }> } | undefined)
    ?.sources;
  return sources?.length === 1 && sources[0]?.serviceAccountToken?.audience === audience;
}

function tokenExpiration(text: string | undefined, fallback: number, warnings: string[]): number {
  if (text === undefined) return fallback;
  const seconds = /^\d+$/.test(text.trim()) ? Number(text.trim()) : Number.NaN;
  if (seconds >= EXPIRATION_RANGE.min && seconds <= EXPIRATION_RANGE.max) return seconds;
  warnings.push(
    `annotation ${TOKEN_EXPIRATION_ANNOTATION}="${text}" is not a number of seconds from ${EXPIRATION_RANGE.min} to ${EXPIRATION_RANGE.max}: using ${fallback}`,
  );
  return fallback;
}
