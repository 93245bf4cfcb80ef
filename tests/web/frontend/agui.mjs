// Drives @ag-ui/client's HttpAgent against a streamengine app.
// node agui.mjs <url> <RunAgentInput messages as JSON>  ->  one JSON line: error, event types, messages, result.
import { HttpAgent } from '@ag-ui/client';

const [url, messagesJson] = process.argv.slice(2);
const agent = new HttpAgent({ url, threadId: 'thread-1', initialMessages: JSON.parse(messagesJson) });
const events = [];
let error = null;
let result = null;
try {
  const run = await agent.runAgent({ runId: 'run-1' }, {
    onEvent: ({ event }) => { events.push(event); },
  });
  result = run.result ?? null;
} catch (caught) {
  error = String(caught?.message ?? caught);
}
process.stdout.write(JSON.stringify({ error, events, messages: agent.messages, result }) + '\n');
