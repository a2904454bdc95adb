// Drives lodger's UI message stream with the Vercel AI SDK's own client code and prints
// what it rendered as JSON on stdout. Usage: node ai_sdk_client.mjs '<json config>'
//   {"mode": "chat", "url", "token", "session", "text", "approve": true|false}
//     AbstractChat (what useChat wraps) over DefaultChatTransport: send the text; when
//     the answer stops at a tool approval, answer it with addToolApprovalResponse and let
//     sendAutomaticallyWhen post the continuation.
//   {"mode": "read", "url", "token", "session", "start"}
//     the transport's reconnectToStream (the SDK's own SSE and chunk parsing) on
//     GET .../ai-sdk/stream, rendered by readUIMessageStream.
import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from "ai";

const config = JSON.parse(process.argv[2]);
const base = `${config.url}/v1/sessions/${config.session}`;
const headers = { Authorization: `Bearer ${config.token}` };

class MemoryState {
  constructor() {
    this.status = "ready";
    this.error = undefined;
    this.messages = [];
    this.updates = []; // each text the assistant message showed, in order
  }
  pushMessage(message) {
    this.messages = [...this.messages, message];
  }
  popMessage() {
    this.messages = this.messages.slice(0, -1);
  }
  replaceMessage(index, message) {
    const copy = this.snapshot(message);
    this.messages = [...this.messages.slice(0, index), copy, ...this.messages.slice(index + 1)];
    const text = copy.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
    if (this.updates[this.updates.length - 1] !== text) this.updates.push(text);
  }
  snapshot(thing) {
    return structuredClone(thing);
  }
}

class Chat extends AbstractChat {
  constructor(init) {
    const state = new MemoryState();
    super({ ...init, state });
    this.memory = state;
  }
}

async function until(check, what) {
  const deadline = Date.now() + 30000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function chat() {
  const finishes = [];
  const errors = [];
  const chat = new Chat({
    id: config.session,
    transport: new DefaultChatTransport({ api: `${base}/ai-sdk/chat`, headers }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onFinish: ({ finishReason, message }) =>
      finishes.push({ finishReason, metadata: message.metadata ?? null }),
    onError: (error) => errors.push(String(error)),
  });
  await chat.sendMessage({ text: config.text });
  await until(() => chat.status !== "streaming" && chat.status !== "submitted", "the answer");
  const first = structuredClone(chat.messages);
  const asked = chat.lastMessage.parts.filter((p) => p.state === "approval-requested");
  if (asked.length > 0) {
    for (const part of asked) {
      await chat.addToolApprovalResponse({ id: part.approval.id, approved: config.approve });
    }
    await until(() => finishes.length >= 2 || errors.length > 0, "the continuation");
    await until(() => chat.status !== "streaming" && chat.status !== "submitted", "the end");
  }
  return {
    first,
    messages: chat.messages,
    finishes,
    errors,
    status: chat.status,
    updates: chat.memory.updates,
  };
}

async function read() {
  const transport = new DefaultChatTransport({
    api: `${base}/ai-sdk/chat`,
    headers,
    prepareReconnectToStreamRequest: () => ({
      api: `${base}/ai-sdk/stream${config.start == null ? "" : `?start=${config.start}`}`,
      headers,
    }),
  });
  const stream = await transport.reconnectToStream({ chatId: config.session });
  if (stream === null) return { none: true };
  const [forChunks, forMessages] = stream.tee();
  const chunks = [];
  const reading = (async () => {
    for await (const chunk of forChunks) chunks.push(chunk);
  })();
  let message = null;
  const errors = [];
  const texts = [];
  for await (const snapshot of readUIMessageStream({
    stream: forMessages,
    onError: (error) => errors.push(String(error)),
  })) {
    message = snapshot;
    texts.push(snapshot.parts.filter((p) => p.type === "text").map((p) => p.text).join(""));
  }
  await reading;
  return { message, chunks, errors, texts };
}

const out = config.mode === "chat" ? await chat() : await read();
process.stdout.write(JSON.stringify(out));
