// chat_request.cpp — see chat_request.h.
#include "chat_request.h"

#include "chat_jinja.h"

namespace moestream::server {

using namespace moestream::chat;  // the chat-format library (tools/chat/), shared with `moestream chat`
namespace {

ApiError refuse(const std::string & param, const std::string & message) {
    ApiError e;
    e.param = param;
    e.message = message;
    return e;
}

}  // namespace

std::optional<ApiError> plan_chat(const ChatFormat & f, const std::string & tmpl_name,
                                  GenParams * p, ChatPlan * plan, bool render_only) {
    ChatExtras & x = p->extras;
    const std::string name = tmpl_name.empty() ? "none" : tmpl_name;
    // A template variable the template never names would be ignored: refused instead.
    for (auto k = x.kwargs.begin(); k != x.kwargs.end(); ++k)
        if (!f.jinja || f.jinja->source().find(k.key()) == std::string::npos)
            return refuse("chat_template_kwargs." + k.key(),
                          "'chat_template_kwargs." + k.key() +
                              "' is not a variable of this model's chat template (" + name + ")");
    if (x.uses_tools() && !f.tools && !(render_only && f.jinja))
        return refuse(x.tools.empty() ? "messages" : "tools",
                      f.jinja && f.jinja->supports_tools()
                          ? "moestream does not parse the tool calls of this model's chat "
                            "template (" + name + "); /apply-template renders them"
                          : "tools are not supported by this model's chat template (" + name +
                                ")");
    ThinkingRequest think;
    think.enable_thinking = x.enable_thinking;
    think.reasoning_effort = x.reasoning_effort;
    std::string think_param;
    const std::string think_err = check_thinking(f, tmpl_name, think, &think_param);
    if (!think_err.empty()) return refuse(think_param, think_err);
    // parallel_tool_calls false: a forced call's grammar allows one; with auto, the generation
    // ends once the first call is complete (the reply parser sends each call as it completes).
    if (x.forces_call() && !p->sampling.grammar.empty())
        return refuse("tool_choice", "tool_choice '" + x.tool_choice +
                                         "' constrains the output with a grammar; 'grammar' and "
                                         "'response_format' cannot be combined with it");
    // A loaded format always has its template (load_chat_format); never send an unrendered
    // prompt.
    if (!f.jinja) return refuse("messages", "the chat template is not loaded (" + name + ")");

    RenderInput in;
    in.messages = x.turns;
    in.tools = x.tools;
    in.enable_thinking = x.enable_thinking.value_or(f.thinking_default);
    in.reasoning_effort = x.reasoning_effort;
    in.messages_json = x.messages_json;
    in.kwargs = x.kwargs;
    std::string err;
    if (!render_chat_format(f, in, &plan->shown, &err)) return refuse("messages", err);
    p->prompt = engine_prompt(f, plan->shown);
    plan->parse = true;
    plan->tools = !x.tools.empty() && x.tool_choice != "none";
    plan->thinking = f.thinking && in.enable_thinking;
    plan->stop_after_call =
        plan->tools && (!x.parallel_tool_calls || one_call_per_reply(f)) && !x.forces_call();
    // The grammar holds from the reply's first token; with thinking on it starts with an
    // optional thinking block, then the call.
    if (x.forces_call())
        p->sampling.grammar = tool_call_grammar(f, x.tools, x.tool_name, !x.parallel_tool_calls,
                                                plan->thinking);
    return std::nullopt;
}

nlohmann::json reply_message(const std::string & content, const std::string & reasoning,
                             const std::vector<ToolCall> & calls) {
    nlohmann::json m{{"role", "assistant"}};
    m["content"] = calls.empty() || !content.empty() ? nlohmann::json(content) : nlohmann::json();
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    if (!calls.empty()) {
        nlohmann::json a = nlohmann::json::array();
        for (const ToolCall & c : calls)
            a.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        m["tool_calls"] = a;
    }
    return m;
}

nlohmann::json tool_call_delta(const ToolCall & c, size_t index) {
    return {{"index", index},
            {"id", c.id},
            {"type", "function"},
            {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

}  // namespace moestream::server
